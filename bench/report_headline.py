"""BENCHMARKS.md's headline from the JSON of goodput_bf16/, goodput_fp32/, goodput_gguf/ and offline_smollm2/:
the systems table, the offline sentence and the goals. So that each figure can be checked by hand:
goodput is the median over searches (a goodput of 0 shows the share that met the SLOs at the
lowest rate); TPOT p50 is at the lowest rate, p99 TTFT at the probe rate (the highest rate every
search of every system measured), one figure per search, "missed" where that search did not meet
the target there; p99 ITL is the largest at any rate up to each search's goodput; ratios are
of the medians, search by search of the searches with the same index.
"""
from __future__ import annotations

import json
from pathlib import Path

from pdserve.bench import report_goodput
from pdserve.bench.report_goodput import ratio
from pdserve.bench.report_offline import throughput_ratio

# llama.cpp's server serves the GGUF as stored (Q4_1), whatever the dtype: a run of its own.
RUNS = {"bfloat16": "goodput_bf16", "float32": "goodput_fp32", "GGUF as stored": "goodput_gguf"}
OFFLINE_RUN = "offline_smollm2"
SHOWN = {"disaggregated": "pdserve up (1P1D)", "colocated": "pdserve serve", "vllm": "vLLM",
         "llama-cpp": "llama.cpp server"}
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
    rows = [goal_ratio(runs, "disaggregated", "vllm", 1.5), goal_ratio(runs, "disaggregated", "colocated", 1.2),
            goal_attainment(runs), goal_itl(runs), goal_ratio(runs, "colocated", "vllm", 1.2), goal_offline(offline)]
    lines += ["| goal (ratio in one run) | measured | met |", "|---|---|---|",
              *(f"| {goal} | {figures} | {met} |" for goal, figures, met in rows)]
    return "\n".join([MARK_BEGIN, "", *lines, "", MARK_END])


def systems_table(runs: dict[str, dict]) -> list[str]:
    lines = ["| | goodput, req/s (searches) | TTFT at idle | TPOT p50 at the lowest rate "
             "| p99 TTFT at the probe rate | p99 ITL up to its goodput |", "|---|---|---|---|---|---|"]
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
                         f"{_ms([max_up_to_goodput(entry, 'p99_itl_ms')])} |")
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


def goal_attainment(runs: dict[str, dict]) -> tuple[str, str, str]:
    """At every rate both measured in the same search."""
    figures, met = [], []
    for dtype, _, up, serve in both_ran(runs, "disaggregated", "colocated"):
        below = []
        for up_search, serve_search in zip(up["repeats"], serve["repeats"]):
            up_points = {point["request_rate"]: point for point in up_search["points"]}
            below += [f"{rate:g} ({up_points[rate]['attainment']:.0%} against {point['attainment']:.0%})"
                      for point in serve_search["points"]
                      if (rate := point["request_rate"]) in up_points and up_points[rate]["attainment"] < point["attainment"]]
        figures.append(f"{dtype}: " + (f"below at {', '.join(below)}" if below else "never below"))
        met.append(f"{dtype} {_yes(not below)}")
    return "up's attainment never below serve's at a rate both probed", "; ".join(figures), ", ".join(met)


def goal_itl(runs: dict[str, dict]) -> tuple[str, str, str]:
    figures, met = [], []
    for dtype, run in runs.items():
        up = measured(run).get("disaggregated")
        if up is not None:
            value = max_up_to_goodput(up, "p99_itl_ms")
            figures.append(f"{dtype}: {_ms([value])}")
            met.append(f"{dtype} {_yes(value is not None and value <= 100)}")
    return "up's p99 ITL ≤ 100 ms at every rate up to its goodput", "; ".join(figures), ", ".join(met)


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


def max_up_to_goodput(entry: dict, key: str) -> float | None:
    """The largest `key` at any rate up to each search's goodput."""
    values = [point["figures"][key] for search in entry["repeats"] if search["goodput"]
              for point in search["points"] if point["request_rate"] <= search["goodput"]]
    return max(values, default=None)


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
