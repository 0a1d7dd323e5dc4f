"""The report of a `pdserve bench offline` run: offline.md from offline.json.

A pure function of the combined result (`offline.json`). Per dtype, each engine's median seconds
over its timed runs, output tokens/s and total (prompt + output) tokens/s, and pdserve's
throughput divided by vLLM's from the same run ("—" where either did not run): a ratio, stated,
never judged. How many prompts got identical greedy tokens from both engines is stated too.
"""
from __future__ import annotations

from pathlib import Path


RESULT_JSON_NAME = "offline.json"
MARKDOWN_NAME = "offline.md"


def throughput_ratio(engines: dict[str, dict], field: str) -> float | None:
    """pdserve's `field` ÷ vLLM's, None unless both ran."""
    if any(engines.get(engine, {}).get("status") != "ok" for engine in ("pdserve", "vllm")):
        return None
    return engines["pdserve"][field] / engines["vllm"][field]


def shown_command(argv: list[str]) -> list[str]:
    """The command with the peer script named by its file name only (its folder is local)."""
    return [Path(arg).name if previous == "--peer-vllm" else arg for previous, arg in zip(["", *argv], argv)]


def markdown(combined: dict) -> str:
    workload, model, machine, found = (combined[key] for key in ("workload", "model", "machine", "versions"))
    lens = workload["input_lens"]
    lines = [
        f"### Offline engines: pdserve `engine.LLM.generate` and vLLM `LLM.generate`, {combined['date']}",
        "",
        f"- model: {model.get('architectures')}, hidden {model.get('hidden_size')}, "
        f"{model.get('num_hidden_layers')} layers, vocab {model.get('vocab_size')}",
        f"- workload: {workload['dataset']}, {workload['num_prompts']} prompts of {lens['min']}–{lens['max']} tokens "
        f"(mean {lens['mean']:g}, {lens['total']} in all), {workload['output_len']} output tokens each "
        f"(ignore_eos, greedy), seed {workload['seed']}, passed as token ids; vLLM's prefix caching off",
        f"- timing: {workload['num_warmup_runs']} warm-up run, then the median of {workload['num_timed_runs']} "
        "timed runs of the whole generate call",
        f"- CPUs {combined['cpus']} with {combined['num_threads']} thread(s) for each engine; machine: "
        f"{machine.get('Model name', '?')}, {machine.get('CPU(s)', '?')} CPUs",
        f"- versions: torch {found.get('torch')}, vLLM {_vllm_version(combined)}, pdserve {found.get('pdserve_commit')}",
        f"- command: `{' '.join(shown_command(combined['command']))}`",
        "",
        "| dtype | engine | seconds | output tok/s | total tok/s | output tok/s ÷ vLLM |",
        "|---|---|---:|---:|---:|---:|",
    ]
    notes = []
    for dtype, entry in combined["dtypes"].items():
        engines = entry["engines"]
        for engine, result in engines.items():
            if result["status"] != "ok":
                notes.append(f"- {engine} {dtype}: {result['status']} ({result['note']})")
                continue
            shown_ratio = throughput_ratio(engines, "output_tok_per_s") if engine == "pdserve" else None
            lines.append(f"| {dtype} | {engine} | {result['seconds']:.2f} | {result['output_tok_per_s']:.0f} | "
                         f"{result['total_tok_per_s']:.0f} | {'—' if shown_ratio is None else f'{shown_ratio:.2f}x'} |")
        if entry["num_same_outputs"] is not None:
            notes.append(f"- {dtype}: {entry['num_same_outputs']} of {workload['num_prompts']} prompts got the "
                         "same greedy tokens from both engines")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _vllm_version(combined: dict) -> str:
    ran = [entry["engines"]["vllm"] for entry in combined["dtypes"].values() if entry["engines"]["vllm"]["status"] == "ok"]
    return ran[0]["version"] if ran else "—"


def write_report(combined: dict, result_dir: Path) -> None:
    """offline.md, into `result_dir`."""
    (result_dir / MARKDOWN_NAME).write_text(markdown(combined))

