"""How many prompt tokens one engine step may take so that the step lasts at most `max_step_s`:
Sarathi-Serve's budgeted chunking, with the inter-token latency target as the budget.

A step that runs decodes and prompt chunks together lasts about

    step_s = decode_s + prompt_tokens * s_per_prompt_token

`decode_s` (a step of decodes alone, at the current batch) and `s_per_prompt_token` are learned
from the steps the engine runs, as exponential moving averages; the budget is what is left of
`max_step_s` after the decodes, in prompt tokens, never fewer than `min_tokens` (prompts always
progress) nor more than `max_tokens` (the scheduler's own budget). Before any step with a prompt
chunk has been timed, the budget is `min_tokens`; the cost of a prompt token is always above 0.
Pure arithmetic: times are passed in.
"""
from __future__ import annotations

# A decode replica's, for the prompts it prefills itself. On the goodput workload (bfloat16, AMD EPYC,
# bench/results/goodput_bf16_step_budget) p99 ITL at 1.5 req/s was 79 ms at 60, 91-93 at 75 and
# 114-120 at 100 (the steps' own noise rides above the budget); alternated three times at 3 and 4
# req/s, 111-134 ms at 60 against 121-223 at 75. The share of requests meeting the SLOs moved
# within the runs' noise throughout (at 3 req/s 96-99 % at 60, 84-100 % at 75).
# `pdserve serve` keeps chunks bounded by tokens alone: there (two threads, same workload) a 100 ms
# budget, patched in, met the SLOs for 26 % and 81 % of requests at 3 req/s against 100 % twice without one
# (TTFT p50 3.3 and 0.9 s against 0.25 and 0.30): a 100 ms step held about 100 prompt tokens, its
# decodes and a fresh read of every weight taking the rest, so prompts advanced at half their rate.
DEFAULT_MAX_STEP_MS = 60.0
SMOOTHING = 0.2  # weight of the newest observation
MIN_TIMED_PROMPT_TOKENS = 8  # smaller chunks say more about noise than about the cost of a token


class StepBudget:
    def __init__(self, max_step_s: float, max_tokens: int, min_tokens: int = 16):
        if max_step_s <= 0 or not 1 <= min_tokens <= max_tokens:
            raise ValueError(f"need max_step_s > 0 and 1 <= min_tokens <= max_tokens, got "
                             f"{max_step_s}, {min_tokens}, {max_tokens}")
        self.max_step_s = max_step_s
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.decode_s = 0.0  # a step of decodes alone
        self.s_per_prompt_token: float | None = None

    def prompt_tokens(self, num_decodes: int) -> int:
        """The prompt tokens the next step may take beside `num_decodes` decodes."""
        if self.s_per_prompt_token is None:
            return self.min_tokens
        left_s = self.max_step_s - (self.decode_s if num_decodes else 0.0)
        return max(self.min_tokens, min(self.max_tokens, int(left_s / self.s_per_prompt_token)))

    def observe(self, num_decodes: int, num_prompt_tokens: int, seconds: float) -> None:
        """Learns from one step: `num_decodes` decodes and `num_prompt_tokens` prompt tokens took `seconds`."""
        if num_prompt_tokens == 0:
            if num_decodes:
                self.decode_s = _smooth(self.decode_s or seconds, seconds)
            return
        if num_prompt_tokens < MIN_TIMED_PROMPT_TOKENS:
            return
        prompt_s = (seconds - (self.decode_s if num_decodes else 0.0)) / num_prompt_tokens
        if prompt_s <= 0:  # the step beat the decodes' own estimate: it says nothing of the prompt's cost
            return
        average = prompt_s if self.s_per_prompt_token is None else self.s_per_prompt_token
        self.s_per_prompt_token = _smooth(average, prompt_s)


def _smooth(average: float, value: float) -> float:
    return (1 - SMOOTHING) * average + SMOOTHING * value
