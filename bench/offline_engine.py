"""One engine's side of `bench.offline`, in its own process: pdserve's or vLLM's `LLM.generate`.

    python -m pdserve.bench.offline_engine pdserve SPEC_JSON RESULT_JSON       (pdserve's python)
    PEER_SCRIPT python bench/offline_engine.py vllm SPEC_JSON RESULT_JSON      (the peer's)

Reads the spec `bench.offline` writes, generates every prompt once to warm up, then
`num_timed_runs` times on the clock (greedy, ignoring EOS), and writes seconds per timed run,
token counts and the last run's output ids. Both engines run with prefix caching off, since
every run repeats the warm-up's prompts; vLLM with the peer server's memory settings. In the
peer's interpreter pdserve is not installed: this file imports only the standard library at its
top.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

VLLM_MAX_MODEL_LEN = 2048
VLLM_GPU_MEMORY_UTILIZATION = 0.4


def pdserve_engine(spec: dict):
    """(generate(prompts) -> outputs, what the result records of the engine); so does vllm_engine."""
    import torch

    from pdserve.engine import LLM, SamplingParams

    llm = LLM(spec["model"], dtype=spec["dtype"], kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)
    return lambda prompts: llm.generate(prompts, params), {"torch_num_threads": torch.get_num_threads()}


def vllm_engine(spec: dict):
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], enable_prefix_caching=False,
                   max_model_len=VLLM_MAX_MODEL_LEN, gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION, seed=0)
    params = vllm.SamplingParams(max_tokens=spec["output_len"], temperature=0.0, ignore_eos=True)
    return (lambda prompts: llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params),
            {"version": vllm.__version__})


def main(engine: str, spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    generate, about = {"pdserve": pdserve_engine, "vllm": vllm_engine}[engine](spec)
    prompts = spec["prompt_token_ids"]
    run_s, outputs = [], []  # the warm-up's first
    for run in range(1 + spec["num_timed_runs"]):
        started_s = time.perf_counter()
        outputs = generate(prompts)
        run_s.append(time.perf_counter() - started_s)
        name = "warm-up" if run == 0 else f"timed run {run}/{spec['num_timed_runs']}"
        print(f"{engine} {spec['dtype']}: {name} took {run_s[-1]:.2f} s", file=sys.stderr, flush=True)
    output_ids = [list(output.outputs[0].token_ids) for output in outputs]
    Path(result_path).write_text(json.dumps({
        "engine": engine, **about, "timed_s": run_s[1:], "num_prompt_tokens": sum(map(len, prompts)),
        "num_output_tokens": sum(map(len, output_ids)), "output_token_ids": output_ids}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
