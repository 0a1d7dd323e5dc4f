"""One engine's side of `bench.offline`: pdserve's `engine.LLM.generate`, in its own process.

    python -m bench.offline_pdserve SPEC_JSON RESULT_JSON

Reads the spec `bench.offline` writes (model, dtype, prompt token ids, output length,
number of timed runs), generates every prompt once to warm up and then `num_timed_runs` times
on the clock, greedy and ignoring EOS, and writes the result (seconds per timed run, token
counts, the last run's output ids). `bench/offline_vllm.py` is the same loop over vLLM's `LLM`.
Progress goes to stderr; the process's CPUs and thread counts are whatever its parent set.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(spec_path: str, result_path: str) -> int:
    import torch

    from pdserve.engine import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(spec["model"], dtype=spec["dtype"])
    params = SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)
    prompts = spec["prompt_token_ids"]
    timed_s, outputs = [], []
    for run in range(1 + spec["num_timed_runs"]):
        name = "warm-up" if run == 0 else f"timed run {run}/{spec['num_timed_runs']}"
        print(f"pdserve {spec['dtype']}: {name}", file=sys.stderr, flush=True)
        started_s = time.perf_counter()
        outputs = llm.generate(prompts, params)
        elapsed_s = time.perf_counter() - started_s
        print(f"pdserve {spec['dtype']}: {name} took {elapsed_s:.2f} s", file=sys.stderr, flush=True)
        if run:
            timed_s.append(elapsed_s)
    result = {
        "engine": "pdserve", "torch_num_threads": torch.get_num_threads(), "timed_s": timed_s,
        "num_prompt_tokens": sum(len(prompt) for prompt in prompts),
        "num_output_tokens": sum(len(output.outputs[0].token_ids) for output in outputs),
        "output_token_ids": [list(output.outputs[0].token_ids) for output in outputs],
    }
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
