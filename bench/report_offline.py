"""The report of a `pdserve bench offline` run, a pure function of offline.json: offline.md, per
dtype each engine's median seconds, output and total tok/s, pdserve's ÷ vLLM's ("—" unless both
ran), and how many prompts got identical greedy tokens from both engines.
"""
from __future__ import annotations

from pathlib import Path

RESULT_JSON_NAME = "offline.json"


def throughput_ratio(engines: dict[str, dict], field: str) -> float | None:
    """pdserve's `field` ÷ vLLM's, None unless both ran."""
    if any(engines.get(engine, {}).get("status") != "ok" for engine in ("pdserve", "vllm")):
        return None
    return engines["pdserve"][field] / engines["vllm"][field]


def markdown(combined: dict) -> str:
    workload, model, machine, found = (combined[key] for key in ("workload", "model", "machine", "versions"))
    lens = workload["input_lens"]
    command = [Path(arg).name if flag == "--peer-vllm" else arg  # the peer's folder is local
               for flag, arg in zip(["", *combined["command"]], combined["command"])]
    vllm_runs = [entry["engines"]["vllm"] for entry in combined["dtypes"].values()
                 if entry["engines"]["vllm"]["status"] == "ok"]
    lines = [
        f"### Offline engines: pdserve `engine.LLM.generate` and vLLM `LLM.generate`, {combined['date']}", "",
        f"- model: {model.get('architectures')}, hidden {model.get('hidden_size')}, "
        f"{model.get('num_hidden_layers')} layers, vocab {model.get('vocab_size')}",
        f"- workload: {workload['dataset']}, {workload['num_prompts']} prompts of {lens['min']}–{lens['max']} tokens "
        f"(mean {lens['mean']:g}, {lens['total']} in all), {workload['output_len']} output tokens each "
        f"(ignore_eos, greedy), seed {workload['seed']}, passed as token ids; prefix caching off in both engines",
        f"- timing: {workload['num_warmup_runs']} warm-up run, then the median of {workload['num_timed_runs']} "
        "timed runs of the whole generate call",
        f"- CPUs {combined['cpus']} with {combined['num_threads']} thread(s) for each engine; machine: "
        f"{machine.get('Model name', '?')}, {machine.get('CPU(s)', '?')} CPUs",
        f"- versions: torch {found.get('torch')}, vLLM {vllm_runs[0]['version'] if vllm_runs else '—'}, "
        f"pdserve {found.get('pdserve_commit')}",
        f"- command: `{' '.join(command)}`", "",
        "| dtype | engine | seconds | output tok/s | total tok/s | output tok/s ÷ vLLM |",
        "|---|---|---:|---:|---:|---:|"]
    notes = []
    for dtype, entry in combined["dtypes"].items():
        for engine, result in entry["engines"].items():
            if result["status"] != "ok":
                notes.append(f"- {engine} {dtype}: {result['status']} ({result['note']})")
                continue
            ratio = throughput_ratio(entry["engines"], "output_tok_per_s") if engine == "pdserve" else None
            lines.append(f"| {dtype} | {engine} | {result['seconds']:.2f} | {result['output_tok_per_s']:.0f} | "
                         f"{result['total_tok_per_s']:.0f} | {'—' if ratio is None else f'{ratio:.2f}x'} |")
        if entry["num_same_outputs"] is not None:
            notes.append(f"- {dtype}: {entry['num_same_outputs']} of {workload['num_prompts']} prompts got the "
                         "same greedy tokens from both engines")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write_report(combined: dict, result_dir: Path) -> None:
    (result_dir / "offline.md").write_text(markdown(combined))
