"""The offline table from a hand-made result: pdserve ÷ vLLM per dtype, and agreeing outputs."""
from pdserve.bench.offline import num_same_outputs
from pdserve.bench.report_offline import markdown, throughput_ratio


def engine(seconds: float, num_output_tokens: int = 400) -> dict:
    return {"status": "ok", "seconds": seconds, "timed_s": [seconds], "num_prompt_tokens": 1600,
            "num_output_tokens": num_output_tokens, "output_tok_per_s": num_output_tokens / seconds,
            "total_tok_per_s": (1600 + num_output_tokens) / seconds}


def combined() -> dict:
    return {
        "date": "2026-01-01T00:00:00+00:00", "command": ["pdserve", "bench", "offline"],
        "model": {"architectures": ["LlamaForCausalLM"]}, "machine": {}, "versions": {"torch": "2"},
        "cpus": [1], "num_threads": 1,
        "workload": {"dataset": "prompt-heavy", "num_prompts": 8, "output_len": 50, "seed": 0, "num_warmup_runs": 1,
                     "num_timed_runs": 1, "input_lens": {"min": 40, "max": 550, "mean": 200.0, "total": 1600}},
        "dtypes": {"float32": {"engines": {"pdserve": engine(2.0), "vllm": {**engine(2.5), "version": "0.32.0"}},
                               "num_same_outputs": 7},
                   "bfloat16": {"engines": {"pdserve": engine(1.0),
                                            "vllm": {"status": "failed", "note": "exit status 1"}},
                                "num_same_outputs": None}},
    }


def test_the_ratio_is_pdserves_throughput_over_vllms_in_the_same_dtype():
    run = combined()
    assert throughput_ratio(run["dtypes"]["float32"]["engines"], "output_tok_per_s") == 200 / 160
    assert throughput_ratio(run["dtypes"]["bfloat16"]["engines"], "output_tok_per_s") is None
    text = markdown(run)
    assert "| float32 | pdserve | 2.00 | 200 | 1000 | 1.25x |" in text
    assert "| float32 | vllm | 2.50 | 160 | 800 | — |" in text
    assert "| bfloat16 | pdserve | 1.00 | 400 | 2000 | — |" in text
    assert "- vllm bfloat16: failed (exit status 1)" in text
    assert "vLLM 0.32.0" in text  # the version the vLLM runs reported
    assert "- float32: 7 of 8 prompts got the same greedy tokens from both engines" in text


def test_outputs_agree_prompt_by_prompt_only_when_both_engines_ran():
    ran = {"pdserve": {"status": "ok", "output_token_ids": [[1, 2], [3, 4], [5]]},
           "vllm": {"status": "ok", "output_token_ids": [[1, 2], [3, 9], [5]]}}
    assert num_same_outputs(ran) == 2
    assert num_same_outputs({**ran, "vllm": {"status": "skipped"}}) is None
