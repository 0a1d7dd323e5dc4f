"""BENCHMARKS.md's headline from the JSON of goodput_bf16/, goodput_fp32/ and offline_smollm2/:
the systems table, the offline sentence and the goals. So that each figure can be checked by hand:
goodput is the median over searches (a goodput of 0 shows the share that met the SLOs at the
lowest rate); TPOT p50 is at the lowest rate, p99 TTFT at the probe rate (the highest rate every
search of every system measured), one figure per search, "missed" where that search did not meet
the target there; max ITL is the largest gap at any rate up to each search's goodput; ratios are
of the medians, search by search of the searches with the same index. The decode step's read
roofline is not in these results: its goal names the command that measures it.
"""
from __future__ import annotations

import json
from pathlib import Path

from pdserve.bench import report_goodput
from pdserve.bench.report_goodput import ratio
from pdserve.bench.report_offline import throughput_ratio

RUNS = {"bfloat16": "goodput_bf16", "float32": "goodput_fp32"}
OFFLINE_RUN = "offline_smollm2"
SHOWN = {"disaggregated": "pdserve up (1P1D)", "colocated": "pdserve serve", "vllm": "vLLM"}
MARK_BEGIN = "<!-- headline: written by `pdserve bench report`; edit bench/report_headline.py, not this -->"
MARK_END = "<!-- headline: end -->"


def load(results: Path) -> tuple[dict[str, dict], dict | None]:
    """The goodput runs found, by dtype, and the offline run (None when absent)."""
    paths = {dtype: results / name / report_goodput.JSON_NAME for dtype, name in RUNS.items()}
    offline = results / OFFLINE_RUN / "offline.json"
    return ({dtype: json.loads(path.read_text()) for dtype, path in paths.items() if path.is_file()},
            json.loads(offline.read_text()) if offline.is_file() else None)


def render(runs: dict[str, dict], offline: dict | None) -> str:
    lines = systems_table(runs) + [""] if runs else []
    if offline is not None:
        lines += [offline_sentence(offline), ""]
    rows = [goal_ratio(runs, "disaggregated", "vllm", 1.5), goal_ratio(runs, "disaggregated", "colocated", 2.0),
            goal_roofline(runs), goal_tpot(runs), goal_p99_ttft(runs), goal_itl(runs), goal_offline(offline)]
    lines += ["| goal (ratio in one run) | measured | met |", "|---|---|---|",
              *(f"| {goal} | {figures} | {met} |" for goal, figures, met in rows)]
    return "\n".join([MARK_BEGIN, "", *lines, "", MARK_END])


def systems_table(runs: dict[str, dict]) -> list[str]:
    lines = ["| | goodput, req/s (searches) | TTFT at idle | TPOT p50 at the lowest rate "
             "| p99 TTFT at the probe rate | max ITL up to its goodput |", "|---|---|---|---|---|---|"]
    for dtype, run in runs.items():
        lowest, probe = lowest_rate(run), probe_rate(run)
        lines.append(f"| **{dtype}** (lowest {lowest:g}, probe {probe:g} req/s) | | | | | |")
        best = max(entry["goodput"] for entry in measured(run).values())
        for name, entry in measured(run).items():
            idle = (entry.get("idle") or {}).get("client_ttft_ms")
            lines.append(f"| {SHOWN.get(name, name)} | {goodput_cell(entry, best)} | "
                         f"{'—' if idle is None else f'{idle:.0f} ms'} | "
                         f"{_ms(figure_at(entry, lowest, 'median_tpot_ms', run))} | "
                         f"{_ms(figure_at(entry, probe, 'p99_ttft_ms', run))} | "
                         f"{_ms([max_itl_up_to_goodput(entry)])} |")
    return lines


def offline_sentence(offline: dict) -> str:
    parts = [f"{engines['pdserve']['output_tok_per_s']:.0f} against {engines['vllm']['output_tok_per_s']:.0f} "
             f"in {dtype} ({value:.2f}x)" for dtype, engines, value in offline_ratios(offline)]
    return ("Offline, the engines alone (`pdserve bench offline`, [table](bench/results/offline_smollm2/offline.md)): "
            "pdserve's `LLM.generate` output tok/s against vLLM's: " + (", ".join(parts) or "vLLM did not run") + ".")


def goal_ratio(runs: dict[str, dict], mine: str, theirs: str, at_least: float) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, _, a, b in both_ran(runs, mine, theirs):
        per_search = ", ".join(ratio(x, y) for x, y in zip(a["goodput_per_repeat"], b["goodput_per_repeat"]))
        figures.append(f"{dtype}: {ratio(a['goodput'], b['goodput'])} ({a['goodput']:g} against {b['goodput']:g}; "
                       f"search by search {per_search})")
        met.append(f"{dtype} {_yes(b['goodput'] > 0 and a['goodput'] >= at_least * b['goodput'])}")
    return f"{mine} goodput ≥ {at_least:g}x {theirs}'s", "; ".join(figures) or "not run", ", ".join(met) or "—"


def goal_roofline(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures = [f"{dtype}: {_ms(figure_at(measured(run)['disaggregated'], lowest_rate(run), 'median_tpot_ms', run))}"
               f" at {lowest_rate(run):g} req/s" for dtype, run in runs.items() if "disaggregated" in measured(run)]
    return ("up's TPOT p50 at the lowest rate ≤ 1.3x the decode step's read roofline",
            "; ".join(figures) + "; the roofline is not in these results: `pdserve bench decode-step --batch-sizes 1`",
            "judged by hand")


def goal_tpot(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run, colocated, vllm in both_ran(runs, "colocated", "vllm"):
        rate = lowest_rate(run)
        mine, theirs = (figure_at(entry, rate, "median_tpot_ms", run) for entry in (colocated, vllm))
        figures.append(f"{dtype}: {_ms(mine)} against {_ms(theirs)} at {rate:g} req/s")
        met.append(f"{dtype} {_yes(None not in mine + theirs and max(mine) <= min(theirs))}")
    return "colocated TPOT p50 ≤ vLLM's (every search)", "; ".join(figures), ", ".join(met)


def goal_p99_ttft(runs: dict[str, dict]) -> tuple[str, str, str]:
    """At every rate both measured in the same search where vLLM met the target."""
    figures, met = [], []
    for dtype, run, up, vllm in both_ran(runs, "disaggregated", "vllm"):
        ratios = []
        for up_search, vllm_search in zip(up["repeats"], vllm["repeats"]):
            up_points = {point["request_rate"]: point for point in up_search["points"]}
            ratios += [up_points[point["request_rate"]]["figures"]["p99_ttft_ms"] / point["figures"]["p99_ttft_ms"]
                       for point in vllm_search["points"]
                       if point["attainment"] >= _target(run) and point["request_rate"] in up_points]
        figures.append(f"{dtype}: up ÷ vLLM {min(ratios):.2f}x-{max(ratios):.2f}x over {len(ratios)} rates"
                       if ratios else f"{dtype}: no rate where vLLM met the target")
        met.append(f"{dtype} {_yes(bool(ratios) and max(ratios) <= 1.5)}")
    return "up's p99 TTFT ≤ 1.5x vLLM's where vLLM meets the target", "; ".join(figures), ", ".join(met)


def goal_itl(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run in runs.items():
        maxima = {SHOWN.get(name, name): max_itl_up_to_goodput(entry) for name, entry in measured(run).items()}
        figures.append(f"{dtype}: " + ", ".join(f"{name} {_ms([value])}" for name, value in maxima.items()))
        met.append(f"{dtype}: " + ", ".join(f"{name} {_yes(value is not None and value <= 500)}"
                                            for name, value in maxima.items()))
    return "no ITL over 500 ms up to the goodput", "; ".join(figures), "; ".join(met)


def goal_offline(offline: dict | None) -> tuple[str, str, str]:
    found = offline_ratios(offline)
    figures = ", ".join(f"{value:.2f}x {dtype}" for dtype, _, value in found)
    met = ", ".join(f"{dtype} {_yes(value >= 1.2)}" for dtype, _, value in found)
    return "offline engine ≥ 1.2x vLLM's output tok/s", figures or "not run", met or "—"


def offline_ratios(offline: dict | None) -> list[tuple[str, dict, float]]:
    """(dtype, engines, pdserve's output tok/s ÷ vLLM's) for each dtype both engines ran."""
    entries = (offline or {"dtypes": {}})["dtypes"].items()
    found = [(dtype, entry["engines"], throughput_ratio(entry["engines"], "output_tok_per_s"))
             for dtype, entry in entries]
    return [row for row in found if row[2] is not None]


def measured(run: dict) -> dict[str, dict]:
    """The systems that ran, pdserve up first (SHOWN's order)."""
    order = [*SHOWN, *run["systems"]]
    return dict(sorted(report_goodput.measured(run["systems"]).items(), key=lambda item: order.index(item[0])))


def both_ran(runs: dict[str, dict], mine: str, theirs: str):
    """(dtype, run, mine's entry, theirs') for each run where both systems ran."""
    for dtype, run in runs.items():
        systems = measured(run)
        if mine in systems and theirs in systems:
            yield dtype, run, systems[mine], systems[theirs]


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
        found.append(point["figures"][key] if point and point["attainment"] >= _target(run) else None)
    return found


def max_itl_up_to_goodput(entry: dict) -> float | None:
    gaps = [point["figures"]["max_itl_ms"] for search in entry["repeats"] if search["goodput"]
            for point in search["points"] if point["request_rate"] <= search["goodput"]]
    return max(gaps, default=None)


def goodput_cell(entry: dict, best: float) -> str:
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


def _target(run: dict) -> float:
    return run["workload"]["target_attainment"]


def _ms(values: list[float | None]) -> str:
    if not values or all(value is None for value in values):
        return "—"
    return ", ".join("missed" if value is None else f"{value:.0f}" for value in values) + " ms"


def _yes(met: bool) -> str:
    return "met" if met else "not met"
