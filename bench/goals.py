"""The performance goals, each read off the results `make bench` leaves under bench/results/.

    python -m bench.goals bench/results      # writes bench/results/goals.md and prints it

One row per goal and run: the goal, the ratio measured within that run (systems side by side,
same trace, same machine), the run's directory, and whether it is met. A run that is missing or
where a system failed is "not run", never a pass. A pure function of the result files, so the
table always says what the files say.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GOALS_NAME = "goals.md"
Results = dict[str, dict]  # run directory name -> its compare.json / offline.json / kv_transfer.json


@dataclass(frozen=True, slots=True)
class Row:
    goal: str
    run: str
    measured: str
    met: bool | None  # None: not run, or stated without a target


def _system(results: Results, run: str, system: str) -> dict | None:
    entry = results.get(run, {}).get("systems", {}).get(system)
    if entry is None or entry.get("status") != "ok":
        return None
    return entry["result"]


def _ratio(results: Results, run: str, system: str, over: str, field: str) -> float | None:
    mine, theirs = _system(results, run, system), _system(results, run, over)
    if mine is None or theirs is None or not theirs[field]:
        return None
    return mine[field] / theirs[field]


def _throughput_and_ttft(goal: str, run: str, system: str, over: str, min_throughput: float,
                         max_ttft: float) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        throughput = _ratio(results, run, system, over, "output_throughput")
        ttft = _ratio(results, run, system, over, "p99_ttft_ms")
        if throughput is None or ttft is None:
            return Row(goal, run, "not run", None)
        return Row(goal, run, f"output tok/s {throughput:.2f}x, p99 TTFT {ttft:.2f}x",
                   throughput >= min_throughput and ttft <= max_ttft)
    return check


def _itl(goal: str, run: str, max_ratio: float) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        itl = _ratio(results, run, "disaggregated", "colocated", "p99_itl_ms")
        if itl is None:
            return Row(goal, run, "not run", None)
        return Row(goal, run, f"p99 ITL {itl:.2f}x", itl <= max_ratio)
    return check


def _goodput(goal: str, run: str, min_ratio: float) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        continuous, static = _system(results, run, "colocated"), _system(results, run, "static")
        if continuous is None or static is None:
            return Row(goal, run, "not run", None)
        slos = results[run]["workload"]["goodput_slos_ms"]
        shown_slos = ", ".join(f"{name} ≤ {ms:g} ms" for name, ms in slos.items())
        goodputs = f"{continuous['request_goodput']:.2f} vs {static['request_goodput']:.2f} req/s"
        if not static["request_goodput"]:  # no static request met the SLO: the ratio is unbounded
            return Row(goal, run, f"goodput {goodputs} ({shown_slos})", continuous["request_goodput"] > 0)
        ratio = continuous["request_goodput"] / static["request_goodput"]
        return Row(goal, run, f"goodput {ratio:.2f}x, {goodputs} ({shown_slos})", ratio >= min_ratio)
    return check


def _transfer(goal: str, path: str, check_row: Callable[[dict, dict], tuple[str, bool]]) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        rows = {row["path"]: row for row in results.get("kv_transfer", {}).get("rows", [])}
        if path not in rows:
            return Row(goal, "kv_transfer", "not run", None)
        measured, met = check_row(rows[path], next(iter(rows.values())))
        return Row(goal, "kv_transfer", measured, met)
    return check


def _offline(dtype: str) -> Callable[[Results], Row]:
    goal = f"engine only, {dtype}: pdserve `LLM.generate` ÷ vLLM's (stated, no target)"

    def check(results: Results) -> Row:
        engines = results.get("offline", {}).get("dtypes", {}).get(dtype, {}).get("engines", {})
        if any(engines.get(name, {}).get("status") != "ok" for name in ("pdserve", "vllm")):
            return Row(goal, "offline", "not run", None)
        ratio = engines["pdserve"]["output_tok_per_s"] / engines["vllm"]["output_tok_per_s"]
        return Row(goal, "offline", f"output tok/s {ratio:.2f}x", None)
    return check


def _prefix_ttft(goal: str, run: str, max_ratio: float) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        median = _ratio(results, run, "colocated", "colocated-nocache", "median_ttft_ms")
        p99 = _ratio(results, run, "colocated", "colocated-nocache", "p99_ttft_ms")
        if median is None or p99 is None:
            return Row(goal, run, "not run", None)
        return Row(goal, run, f"p50 TTFT {median:.2f}x, p99 {p99:.2f}x", median <= max_ratio and p99 <= max_ratio)
    return check


def _routing_hit_rate(goal: str, run: str) -> Callable[[Results], Row]:
    def check(results: Results) -> Row:
        rates = [_decode_hit_rate(_system(results, run, name)) for name in ("disaggregated", "disaggregated-load")]
        if None in rates:
            return Row(goal, run, "not run", None)
        return Row(goal, run, f"decode hit rate {rates[0]:.1%} vs {rates[1]:.1%}", None)
    return check


def _decode_hit_rate(result: dict | None) -> float | None:
    if result is None:
        return None
    by_role = ((result.get("server") or {}).get("prefix_cache") or {}).get("by_role", {})
    return (by_role.get("decode") or {}).get("hit_rate")


COLOCATED_VS_VLLM = "colocated ≥ 1.2x vLLM output tok/s, p99 TTFT ≤ vLLM's"
DISAGGREGATED_VS_COLOCATED = "disaggregated ≥ 0.9x colocated output tok/s, p99 TTFT ≤ 1.5x colocated's"
CHECKS: list[Callable[[Results], Row]] = [
    *(_throughput_and_ttft(COLOCATED_VS_VLLM, run, "colocated", "vllm", 1.2, 1.0)
      for run in ("saturation", "saturation_bf16", "prompt_heavy_fp32", "prompt_heavy_bf16", "saturation_varlen")),
    *(_throughput_and_ttft(DISAGGREGATED_VS_COLOCATED, run, "disaggregated", "colocated", 0.9, 1.5)
      for run in ("saturation", "saturation_bf16", "prompt_heavy_fp32", "prompt_heavy_bf16", "saturation_varlen")),
    _itl("disaggregated p99 ITL ≤ 0.5x colocated's, mixed workload, two server cores", "mixed_two_cores", 0.5),
    _itl("disaggregated p99 ITL ≤ 0.5x colocated's, mixed workload, one server core", "mixed", 0.5),
    _transfer("shm ≥ 0.5x an in-process copy of the same bytes", "kvtransfer TRANSPORT_SHM",
              lambda row, copy: (f"{row['gb_per_s']:.2f} GB/s, {row['gb_per_s'] / copy['gb_per_s']:.2f}x",
                                 row["gb_per_s"] >= 0.5 * copy["gb_per_s"])),
    _transfer("grpc ≥ 1 GB/s on loopback", "kvtransfer TRANSPORT_GRPC",
              lambda row, copy: (f"{row['gb_per_s']:.2f} GB/s", row["gb_per_s"] >= 1.0)),
    _goodput("continuous (colocated) ÷ static goodput ≥ 2x, heavy-tailed outputs", "heavy_tailed", 2.0),
    _prefix_ttft("prefix caching: TTFT ≤ 0.3x without, shared system prompt", "shared_prefix", 0.3),
    _prefix_ttft("prefix caching: TTFT ≤ 0.3x without, multi-turn chats", "multi_turn", 0.3),
    *(_throughput_and_ttft("prefix caching: colocated ≥ 1.2x vLLM output tok/s, both caching, p99 TTFT ≤ vLLM's",
                           run, "colocated", "vllm", 1.2, 1.0) for run in ("shared_prefix", "multi_turn")),
    _routing_hit_rate("cache-aware routing: decode hit rate against load-only routing's, 2 decode replicas "
                      "(stated, no target)",
                      "prefix_routing"),
    _offline("float32"),
    _offline("bfloat16"),
]


def read_results(results_dir: Path) -> Results:
    results: Results = {}
    for run_dir in sorted(path for path in results_dir.iterdir() if path.is_dir()):
        for name in ("compare.json", "offline.json"):
            if (run_dir / name).is_file():
                results[run_dir.name] = json.loads((run_dir / name).read_text())
    if (results_dir / "kv_transfer.json").is_file():
        results["kv_transfer"] = json.loads((results_dir / "kv_transfer.json").read_text())
    return results


def markdown(rows: list[Row]) -> str:
    shown = {True: "met", False: "not met", None: "—"}
    lines = ["| goal | run (bench/results/) | measured | met |", "|---|---|---|---|"]
    lines += [f"| {row.goal} | {row.run} | {row.measured} | {shown[row.met]} |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, nargs="?", default=Path("bench/results"))
    args = parser.parse_args()
    results = read_results(args.results_dir)
    text = markdown([check(results) for check in CHECKS])
    (args.results_dir / GOALS_NAME).write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
