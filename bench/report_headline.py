"""BENCHMARKS.md's headline, computed from the result JSON: the systems table, the offline
sentence and the goals table, each figure a function of goodput_bf16/, goodput_fp32/ and
offline_smollm2/ under the results folder.

Definitions, so that a figure can be checked against the JSON by hand:
- goodput: the median over searches (each search's beside it); a goodput of 0 shows the share
  of requests that met the SLOs at the lowest rate;
- TPOT p50 at the lowest rate the searches climbed, one figure per search;
- p99 TTFT at the probe rate, the highest rate every search of every system measured, per
  search; "missed" where that search did not meet the target there;
- max ITL up to its goodput: the largest gap between two tokens at any rate up to and
  including each search's goodput;
- ratios of goodputs are of the medians; search by search, of the searches with the same index.
The goal that needs the decode step's read roofline names the command that measures it: that
figure is not in these results.
"""
from __future__ import annotations

import json
from pathlib import Path

RUNS = {"bfloat16": "goodput_bf16", "float32": "goodput_fp32"}
OFFLINE_RUN = "offline_smollm2"
SHOWN = {"disaggregated": "pdserve up (1P1D)", "colocated": "pdserve serve", "vllm": "vLLM"}
MARK_BEGIN = "<!-- headline: written by `pdserve bench report`; edit bench/report_headline.py, not this -->"
MARK_END = "<!-- headline: end -->"


def load(results: Path) -> tuple[dict[str, dict], dict | None]:
    """The goodput runs found, by dtype, and the offline run (None when absent)."""
    runs = {dtype: json.loads((results / name / "goodput.json").read_text())
            for dtype, name in RUNS.items() if (results / name / "goodput.json").is_file()}
    offline = results / OFFLINE_RUN / "offline.json"
    return runs, json.loads(offline.read_text()) if offline.is_file() else None


def render(runs: dict[str, dict], offline: dict | None) -> str:
    lines = []
    if runs:
        lines += systems_table(runs) + [""]
    if offline is not None:
        lines += [offline_sentence(offline), ""]
    lines += goals_table(runs, offline)
    return "\n".join([MARK_BEGIN, "", *lines, "", MARK_END])


def systems_table(runs: dict[str, dict]) -> list[str]:
    lines = ["| | goodput, req/s (searches) | TTFT at idle | TPOT p50 at the lowest rate | p99 TTFT at the probe "
             "rate | max ITL up to its goodput |", "|---|---|---|---|---|---|"]
    for dtype, run in runs.items():
        lowest, probe = lowest_rate(run), probe_rate(run)
        lines.append(f"| **{dtype}** (lowest {lowest:g}, probe {probe:g} req/s) | | | | | |")
        best = max(entry["goodput"] for entry in measured(run).values())
        for name, entry in measured(run).items():
            idle = (entry.get("idle") or {}).get("client_ttft_ms")
            lines.append(f"| {SHOWN.get(name, name)} | {goodput_cell(run, entry, best)} | "
                         f"{'—' if idle is None else f'{idle:.0f} ms'} | "
                         f"{_ms(figure_at(entry, lowest, 'median_tpot_ms', run))} | "
                         f"{_ms(figure_at(entry, probe, 'p99_ttft_ms', run))} | {_ms([max_itl_up_to_goodput(entry)])} |")
    return lines


def offline_sentence(offline: dict) -> str:
    parts = []
    for dtype, entry in offline["dtypes"].items():
        engines = entry["engines"]
        if all(engines.get(name, {}).get("status") == "ok" for name in ("pdserve", "vllm")):
            mine, theirs = engines["pdserve"]["output_tok_per_s"], engines["vllm"]["output_tok_per_s"]
            parts.append(f"{mine:.0f} against {theirs:.0f} in {dtype} ({mine / theirs:.2f}x)")
    return ("Offline, the engines alone (`pdserve bench offline`, [table](bench/results/offline_smollm2/offline.md)): "
            "pdserve's `LLM.generate` output tok/s against vLLM's: " + (", ".join(parts) or "vLLM did not run") + ".")


def goals_table(runs: dict[str, dict], offline: dict | None) -> list[str]:
    rows = [goal_ratio(runs, "disaggregated", "vllm", 1.5), goal_ratio(runs, "disaggregated", "colocated", 2.0),
            goal_roofline(runs), goal_tpot(runs), goal_p99_ttft(runs), goal_itl(runs), goal_offline(offline)]
    return ["| goal (ratio in one run) | measured | met |", "|---|---|---|",
            *(f"| {goal} | {figures} | {met} |" for goal, figures, met in rows)]


def goal_ratio(runs: dict[str, dict], mine: str, theirs: str, at_least: float) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run in runs.items():
        systems = measured(run)
        if mine not in systems or theirs not in systems:
            continue
        a, b = systems[mine], systems[theirs]
        per_search = [_ratio(x, y) for x, y in zip(a["goodput_per_repeat"], b["goodput_per_repeat"])]
        figures.append(f"{dtype}: {_ratio(a['goodput'], b['goodput'])} ({a['goodput']:g} against {b['goodput']:g}; "
                       f"search by search {', '.join(per_search)})")
        met.append(f"{dtype} {_yes(b['goodput'] > 0 and a['goodput'] >= at_least * b['goodput'])}")
    return (f"{mine} goodput ≥ {at_least:g}x {theirs}'s", "; ".join(figures) or "not run", ", ".join(met) or "—")


def goal_roofline(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures = [f"{dtype}: {_ms(figure_at(measured(run)['disaggregated'], lowest_rate(run), 'median_tpot_ms', run))}"
               f" at {lowest_rate(run):g} req/s" for dtype, run in runs.items() if "disaggregated" in measured(run)]
    return ("up's TPOT p50 at the lowest rate ≤ 1.3x the decode step's read roofline",
            "; ".join(figures) + "; the roofline is not in these results: `pdserve bench decode-step --batch-sizes 1`",
            "judged by hand")


def goal_tpot(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run in runs.items():
        systems, rate = measured(run), lowest_rate(run)
        if "colocated" not in systems or "vllm" not in systems:
            continue
        mine, theirs = (figure_at(systems[name], rate, "median_tpot_ms", run) for name in ("colocated", "vllm"))
        figures.append(f"{dtype}: {_ms(mine)} against {_ms(theirs)} at {rate:g} req/s")
        both = [value for value in mine + theirs if value is not None]
        met.append(f"{dtype} {_yes(len(both) == len(mine + theirs) and max(mine) <= min(theirs))}")
    return "colocated TPOT p50 ≤ vLLM's (every search)", "; ".join(figures), ", ".join(met)


def goal_p99_ttft(runs: dict[str, dict]) -> tuple[str, str, str]:
    """At every rate both measured in the same search where vLLM met the target."""
    figures, met = [], []
    for dtype, run in runs.items():
        systems = measured(run)
        if "disaggregated" not in systems or "vllm" not in systems:
            continue
        ratios = []
        for up, vllm in zip(systems["disaggregated"]["repeats"], systems["vllm"]["repeats"]):
            up_points = {point["request_rate"]: point for point in up["points"]}
            for point in vllm["points"]:
                if point["attainment"] >= target(run) and point["request_rate"] in up_points:
                    ratios.append(up_points[point["request_rate"]]["figures"]["p99_ttft_ms"]
                                  / point["figures"]["p99_ttft_ms"])
        figures.append(f"{dtype}: up ÷ vLLM {min(ratios):.2f}x-{max(ratios):.2f}x over {len(ratios)} rates"
                       if ratios else f"{dtype}: no rate where vLLM met the target")
        met.append(f"{dtype} {_yes(bool(ratios) and max(ratios) <= 1.5)}")
    return "up's p99 TTFT ≤ 1.5x vLLM's where vLLM meets the target", "; ".join(figures), ", ".join(met)


def goal_itl(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run in runs.items():
        maxima = {name: max_itl_up_to_goodput(entry) for name, entry in measured(run).items()}
        figures.append(f"{dtype}: " + ", ".join(f"{SHOWN.get(name, name)} {_ms([value])}"
                                                for name, value in maxima.items()))
        met.append(f"{dtype}: " + ", ".join(f"{SHOWN.get(name, name)} {_yes(value is not None and value <= 500)}"
                                            for name, value in maxima.items()))
    return "no ITL over 500 ms up to the goodput", "; ".join(figures), "; ".join(met)


def goal_offline(offline: dict | None) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, entry in (offline or {"dtypes": {}})["dtypes"].items():
        engines = entry["engines"]
        if all(engines.get(name, {}).get("status") == "ok" for name in ("pdserve", "vllm")):
            ratio = engines["pdserve"]["output_tok_per_s"] / engines["vllm"]["output_tok_per_s"]
            figures.append(f"{ratio:.2f}x {dtype}")
            met.append(f"{dtype} {_yes(ratio >= 1.2)}")
    return "offline engine ≥ 1.2x vLLM's output tok/s", ", ".join(figures) or "not run", ", ".join(met) or "—"


def measured(run: dict) -> dict[str, dict]:
    """The systems that ran, pdserve up first (SHOWN's order)."""
    order = [*SHOWN, *run["systems"]]
    return {name: run["systems"][name] for name in sorted(run["systems"], key=order.index)
            if run["systems"][name]["status"] == "ok"}


def target(run: dict) -> float:
    return run["workload"]["target_attainment"]


def lowest_rate(run: dict) -> float:
    return min(run["workload"]["rates"])


def probe_rate(run: dict) -> float:
    """The highest rate every search of every system measured."""
    sets = [{point["request_rate"] for point in search["points"]}
            for entry in measured(run).values() for search in entry["repeats"]]
    return max(set.intersection(*sets), default=lowest_rate(run))


def figure_at(entry: dict, rate: float, key: str, run: dict) -> list[float | None]:
    """Per search: `key` at `rate` where that search measured it and met the target there, else None."""
    found = []
    for search in entry["repeats"]:
        point = next((p for p in search["points"] if p["request_rate"] == rate), None)
        found.append(point["figures"][key] if point and point["attainment"] >= target(run) else None)
    return found


def max_itl_up_to_goodput(entry: dict) -> float | None:
    gaps = [point["figures"]["max_itl_ms"] for search in entry["repeats"] if search["goodput"]
            for point in search["points"] if point["request_rate"] <= search["goodput"]]
    return max(gaps, default=None)


def goodput_cell(run: dict, entry: dict, best: float) -> str:
    shown = f"**{entry['goodput']:g}**" if entry["goodput"] == best and best > 0 else f"{entry['goodput']:g}"
    if len(entry["goodput_per_repeat"]) > 1:
        shown += f" ({', '.join(f'{value:g}' for value in entry['goodput_per_repeat'])})"
    if entry["goodput"] == 0:
        lowest = min((p for s in entry["repeats"] for p in s["points"]), key=lambda p: p["request_rate"])
        shown += f" ({lowest['attainment']:.0%} at {lowest['request_rate']:g})"
    return shown


def replace_marked(text: str, headline: str) -> str:
    """`text` with the part between the markers (both included) replaced by `headline`."""
    begin, end = text.index(MARK_BEGIN), text.index(MARK_END) + len(MARK_END)
    return text[:begin] + headline + text[end:]


def _ms(values: list[float | None]) -> str:
    if not values or all(value is None for value in values):
        return "—"
    return ", ".join("missed" if value is None else f"{value:.0f}" for value in values) + " ms"


def _ratio(value: float, other: float) -> str:
    return f"{value / other:.2f}x" if other else ("—" if not value else "∞")


def _yes(met: bool) -> str:
    return "met" if met else "not met"
