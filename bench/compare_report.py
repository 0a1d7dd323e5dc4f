"""The report of one `pdserve bench-compare` run: a markdown table, ratios, and plots.

Everything here is a pure function of the combined result (`compare.json`), so a report can be
redrawn from a saved run: `python -m bench.compare_report RESULT_DIR`. A ratio is one system's
figure divided by a reference system's figure from the same run; it is left out ("—") when
either system did not run, and it is stated, never judged. When the run was given SLOs, a
goodput table states them and each system's rate of requests meeting all of them (vLLM's
`request_goodput`, computed per request by `bench.metrics`), with the ratio to static batching.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

COMBINED_JSON_NAME = "compare.json"
MARKDOWN_NAME = "compare.md"
BARS_PNG_NAME = "compare_bars.png"
CDF_PNG_NAME = "compare_cdf.png"

# (result field, column heading, format)
TABLE_COLUMNS = (
    ("completed", "completed", "{:d}"),
    ("failed", "failed", "{:d}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "output tok/s", "{:.1f}"),
    ("mean_ttft_ms", "mean TTFT ms", "{:.0f}"),
    ("p99_ttft_ms", "p99 TTFT ms", "{:.0f}"),
    ("mean_itl_ms", "mean ITL ms", "{:.1f}"),
    ("p99_itl_ms", "p99 ITL ms", "{:.1f}"),
    ("mean_tpot_ms", "mean TPOT ms", "{:.1f}"),
    ("mean_e2el_ms", "mean E2EL ms", "{:.0f}"),
)

# Systems whose tokens reach the client in one burst per request (all after the batch ends):
# their ITL and TPOT say nothing about decoding speed, so no ratio uses them.
BURST_SYSTEMS = ("static",)
PER_TOKEN_FIELDS = ("mean_itl_ms", "p99_itl_ms", "mean_tpot_ms", "p99_tpot_ms")

# (result field, reference system, column heading): system's figure / reference's figure
RATIOS = (
    ("output_throughput", "static", "output tok/s ÷ static"),
    ("p99_ttft_ms", "static", "p99 TTFT ÷ static"),
    ("output_throughput", "vllm", "output tok/s ÷ vLLM"),
    ("p99_ttft_ms", "vllm", "p99 TTFT ÷ vLLM"),
    ("p99_itl_ms", "vllm", "p99 ITL ÷ vLLM"),
    ("p99_itl_ms", "colocated", "p99 ITL ÷ colocated"),
    ("median_ttft_ms", "colocated-nocache", "p50 TTFT ÷ no prefix cache"),
    ("p99_ttft_ms", "colocated-nocache", "p99 TTFT ÷ no prefix cache"),
)
GOODPUT_RATIO = ("request_goodput", "static", "goodput ÷ static")
SLO_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}


def prefix_hit_rate(result: dict, role: str | None = None) -> float | None:
    """Prompt tokens found in the server's prefix caches over the run ÷ those looked up: in all,
    or in the engines of one `role` ("prefill", "decode")."""
    figures = (result.get("server") or {}).get("prefix_cache") or {}
    if role is not None:
        figures = figures.get("by_role", {}).get(role) or {}
    return figures.get("hit_rate")


def shown_ratios(results: dict[str, dict]) -> tuple:
    """The ratio columns whose reference system ran."""
    return tuple(entry for entry in RATIOS if entry[1] in results)


def results_by_system(combined: dict) -> dict[str, dict]:
    """The vLLM-style result of every system that ran, by name, in run order."""
    return {name: entry["result"] for name, entry in combined["systems"].items()
            if entry["status"] == "ok" and entry.get("result")}


def ratio(combined: dict, field: str, system: str, reference: str) -> float | None:
    results = results_by_system(combined)
    if system == reference or system not in results or reference not in results:
        return None
    if field in PER_TOKEN_FIELDS and {system, reference} & set(BURST_SYSTEMS):
        return None
    numerator, denominator = results[system].get(field), results[reference].get(field)
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratios(combined: dict) -> dict[str, dict[str, float | None]]:
    """{system: {"<field>/<reference>": ratio}} for every system that ran (goodput's too, given SLOs)."""
    shown = RATIOS + ((GOODPUT_RATIO,) if slos_ms(combined) else ())
    return {system: {f"{field}/{reference}": ratio(combined, field, system, reference)
                     for field, reference, _ in shown}
            for system in results_by_system(combined)}


def slos_ms(combined: dict) -> dict[str, float]:
    return combined["workload"].get("goodput_slos_ms") or {}


def slo_text(slos: dict[str, float]) -> str:
    """{"ttft": 1000, "tpot": 50} -> "TTFT ≤ 1000 ms, TPOT ≤ 50 ms"."""
    return ", ".join(f"{SLO_NAMES[key]} ≤ {limit_ms:g} ms" for key, limit_ms in slos.items())


def goodput_lines(combined: dict) -> list[str]:
    """The goodput table: per system, requests/s meeting every SLO, how many did, and ÷ static."""
    slos = slos_ms(combined)
    results = results_by_system(combined)
    if not slos or not results:
        return []
    field, reference, heading = GOODPUT_RATIO
    lines = [f"Goodput: successful requests per second meeting every SLO ({slo_text(slos)}).", "",
             f"| system | goodput req/s | requests within SLO | {heading} |", "|---|---:|---:|---:|"]
    for name, result in results.items():
        num_good = round(result[field] * result["duration"])
        lines.append(f"| {name} | {result[field]:.2f} | {num_good} / {result['num_prompts']} | "
                     f"{format_cell(ratio(combined, field, name, reference), '{:.2f}x')} |")
    if "tpot" in slos and set(BURST_SYSTEMS) & set(results):
        lines += ["", f"{', '.join(name for name in results if name in BURST_SYSTEMS)}: a TPOT of ~0 always meets "
                      "the TPOT SLO; its TTFT includes the whole batch, so the TTFT SLO is the one it can miss."]
    return lines


def markdown(combined: dict) -> str:
    results = results_by_system(combined)
    workload, pinning, model, machine = (combined[key] for key in ("workload", "pinning", "model", "machine"))
    concurrency = workload.get("max_concurrency")
    hit_rate_roles = [role for role in (None, "decode") if any(prefix_hit_rate(r, role) is not None
                                                               for r in results.values())]
    headings = [heading for _, heading, _ in TABLE_COLUMNS] + [
        "prefix hit rate" if role is None else f"{role} hit rate" for role in hit_rate_roles]
    lines = [
        f"### bench-compare, {combined['date']}",
        "",
        f"- model: {model.get('architectures')}, hidden {model.get('hidden_size')}, "
        f"{model.get('num_hidden_layers')} layers, vocab {model.get('vocab_size')}",
        f"- workload: {workload['dataset']}, {workload['num_prompts']} prompts, "
        f"input {_lengths_text(workload, 'input')}{_prefix_text(workload)}, output {_lengths_text(workload, 'output')} tokens "
        f"(ignore_eos, greedy), {workload.get('dtype', 'float32')}, request rate {workload['request_rate']}"
        f"{f', at most {concurrency} in flight' if concurrency else ''}, seed {workload['seed']}",
        f"- machine: {machine.get('Model name', '?')}, {machine.get('CPU(s)', '?')} CPUs, "
        f"{machine.get('memory_gib', '?')} GiB",
        f"- pinning: servers on CPUs {pinning['server_cpus']} with {pinning['server_threads']} thread(s), "
        f"client on CPUs {pinning['client_cpus']}",
        f"- command: `{' '.join(shown_command(combined['command']))}`",
        "",
        "| system | " + " | ".join(headings) + " |",
        "|---|" + "---:|" * len(headings),
    ]
    for name, result in results.items():
        cells = [format_cell(result.get(field), spec) for field, _, spec in TABLE_COLUMNS]
        cells += [format_cell(prefix_hit_rate(result, role), "{:.1%}") for role in hit_rate_roles]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    shown = shown_ratios(results)
    if shown:
        lines += ["", "| system | " + " | ".join(heading for _, _, heading in shown) + " |",
                  "|---|" + "---:|" * len(shown)]
    for name in results if shown else ():
        cells = [format_cell(ratio(combined, field, name, reference), "{:.2f}x") for field, reference, _ in shown]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    goodput = goodput_lines(combined)
    if goodput:
        lines += ["", *goodput]
    bursts = [name for name in results if name in BURST_SYSTEMS]
    if bursts:
        lines += ["", f"{', '.join(bursts)}: each request's tokens arrive together once its batch ends, so its "
                      "ITL and TPOT are ~0 and measure nothing; compare its TTFT and E2EL."]
    not_run = {name: entry for name, entry in combined["systems"].items() if name not in results}
    if not_run:
        lines.append("")
        for name, entry in not_run.items():
            first_line = (entry.get("note") or "").strip().splitlines()[:1]
            lines.append(f"- {name}: {entry['status']}" + (f" ({first_line[0]})" if first_line else ""))
    return "\n".join(lines) + "\n"


def _prefix_text(workload: dict) -> str:
    prefix_len = workload.get("prefix_len")
    return f" (the first {prefix_len} shared)" if prefix_len else ""


def _lengths_text(workload: dict, which: str) -> str:
    """ "40–550 (mean 301.2, median 305)" from the dataset's own lengths; the asked length for older runs."""
    lens = workload.get(f"{which}_lens")
    if lens is None:
        return str(workload[f"{which}_len"])
    if lens["min"] == lens["max"]:
        return str(lens["min"])
    return f"{lens['min']}–{lens['max']} (mean {lens['mean']:g}, median {lens['median']:g})"


def shown_command(argv: list[str]) -> list[str]:
    """The command with the peer script named by its file name only (its folder is local)."""
    return [Path(arg).name if previous == "--peer-vllm" else arg for previous, arg in zip(["", *argv], argv)]


def format_cell(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return spec.format(value)


def write_plots(combined: dict, result_dir: Path) -> list[Path]:
    """A bar chart of throughput and latencies, and CDFs of TTFT and ITL overlaid per system."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    results = results_by_system(combined)
    if not results:
        return []
    names = list(results)
    colors = {name: f"C{index}" for index, name in enumerate(names)}
    title = f"{combined['workload']['dataset']}, {combined['workload']['num_prompts']} prompts, " \
            f"rate {combined['workload']['request_rate']}, {combined['workload'].get('dtype', 'float32')}"

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = ((("output_throughput",), "output tokens/s"), (("mean_ttft_ms", "p99_ttft_ms"), "TTFT ms (mean, p99)"),
              (("mean_itl_ms", "p99_itl_ms"), "ITL ms (mean, p99)"))
    for axis, (fields, label) in zip(axes, panels):
        width = 0.8 / len(fields)
        for offset, field in enumerate(fields):
            values = [results[name].get(field) or 0.0 for name in names]
            bars = axis.bar(np.arange(len(names)) + offset * width, values, width,
                            color=[colors[name] for name in names], alpha=1.0 - 0.45 * offset)
            axis.bar_label(bars, fmt="%.0f" if max(values, default=0) >= 10 else "%.1f", fontsize=7)
        axis.set_xticks(np.arange(len(names)) + width * (len(fields) - 1) / 2, names, fontsize=8)
        axis.set_title(label, fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    bars_path = result_dir / BARS_PNG_NAME
    figure.savefig(bars_path, dpi=80)
    plt.close(figure)

    figure, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name in names:
        ok = [not error for error in results[name]["errors"]]
        ttfts_ms = sorted(t * 1000 for t, good in zip(results[name]["ttfts"], ok) if good)
        itls_ms = sorted(gap * 1000 for gaps in results[name]["itls"] for gap in gaps)
        e2els_ms = sorted(t * 1000 for t, good in zip(results[name]["e2els"], ok) if good)
        for axis, values in zip(axes, (ttfts_ms, itls_ms, e2els_ms)):
            if values:
                axis.plot(values, np.arange(1, len(values) + 1) / len(values), label=name, color=colors[name],
                          drawstyle="steps-post")
    for axis, label in zip(axes, ("TTFT ms", "ITL ms", "E2EL ms")):
        axis.set_xscale("symlog", linthresh=1.0)
        axis.set_xlabel(label)
        axis.set_ylabel("fraction of samples")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"latency CDFs: {title}", fontsize=10)
    figure.tight_layout()
    cdf_path = result_dir / CDF_PNG_NAME
    figure.savefig(cdf_path, dpi=80)
    plt.close(figure)
    return [bars_path, cdf_path]


def write_report(combined: dict, result_dir: Path) -> None:
    """compare.json (with the ratios added), compare.md and the plots, into `result_dir`."""
    combined["ratios"] = ratios(combined)
    (result_dir / COMBINED_JSON_NAME).write_text(json.dumps(combined, indent=1, allow_nan=False))
    (result_dir / MARKDOWN_NAME).write_text(markdown(combined))
    write_plots(combined, result_dir)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.compare_report RESULT_DIR", file=sys.stderr)
        return 2
    result_dir = Path(argv[0])
    write_report(json.loads((result_dir / COMBINED_JSON_NAME).read_text()), result_dir)
    print(result_dir / MARKDOWN_NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
