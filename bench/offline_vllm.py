"""vLLM's side of `bench.offline`: its offline `LLM.generate`, run by the peer's python.

    PEER_SCRIPT python bench/offline_vllm.py SPEC_JSON RESULT_JSON

The same loop as `bench.offline_pdserve` (one warm-up, then `num_timed_runs` on the clock) over
vLLM's `LLM`: prompts as `TokensPrompt`s, greedy, ignoring EOS, prefix caching off (every run
redoes every prefill), the spec's dtype. It runs in the peer's interpreter, where pdserve is not
installed, so it imports nothing but the standard library and vLLM. The vLLM settings not given
here are its defaults, but for `max_model_len` and `gpu_memory_utilization`, which the peer's
server is given too (its default memory share fails on small CPU machines).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

MAX_MODEL_LEN = 2048
GPU_MEMORY_UTILIZATION = 0.4


def main(spec_path: str, result_path: str) -> int:
    import vllm
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(spec_path).read_text())
    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], enable_prefix_caching=False,
                   max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, seed=0)
    params = vllm.SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompt_token_ids"]]
    timed_s, outputs = [], []
    for run in range(1 + spec["num_timed_runs"]):
        name = "warm-up" if run == 0 else f"timed run {run}/{spec['num_timed_runs']}"
        print(f"vllm {spec['dtype']}: {name}", file=sys.stderr, flush=True)
        started_s = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=True)
        elapsed_s = time.perf_counter() - started_s
        print(f"vllm {spec['dtype']}: {name} took {elapsed_s:.2f} s", file=sys.stderr, flush=True)
        if run:
            timed_s.append(elapsed_s)
    result = {
        "engine": "vllm", "version": vllm.__version__, "timed_s": timed_s,
        "num_prompt_tokens": sum(len(ids) for ids in spec["prompt_token_ids"]),
        "num_output_tokens": sum(len(output.outputs[0].token_ids) for output in outputs),
        "output_token_ids": [list(output.outputs[0].token_ids) for output in outputs],
    }
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
