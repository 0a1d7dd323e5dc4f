"""The report of a `pdserve bench goodput` run, a pure function of goodput.json: goodput.md (each
system's goodput and ratios to the others', TTFT at idle, every point) and goodput.png
(attainment against request rate, a line per system and repeat).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from pdserve.bench.engine_time import busy_text

JSON_NAME = "goodput.json"
IDLE_COLUMNS = (("client_ttft_ms", "TTFT at the client"), ("server_ttft_ms", "TTFT at the server"),
                ("server_queue_ms", "queue (to the prefilling engine)"),
                ("server_prefill_ms", "prefill (to its first token)"),
                ("kv_transfer_ms", "KV hand-off"), ("second_token_ms", "first to second token"))


def measured(systems: dict) -> dict[str, dict]:
    """The systems that ran, in the result's order."""
    return {name: entry for name, entry in systems.items() if entry["status"] == "ok"}


def slo_text(workload: dict) -> str:
    return ", ".join(f"{key.upper()} ≤ {value:g} ms" for key, value in workload["slos_ms"].items())


def ratio(value: float, other: float) -> str:
    return f"{value / other:.2f}x" if other else ("—" if not value else "∞")


def write_report(combined: dict, result_dir: Path) -> None:
    (result_dir / "goodput.md").write_text(render_markdown(combined))
    plot_attainment(combined, result_dir / "goodput.png")


def render_markdown(combined: dict) -> str:
    workload, systems = combined["workload"], combined["systems"]
    names = list(measured(systems))
    lines = [
        f"# Goodput: {combined['model']['dir']}, {workload['dtype']}", "",
        f"Goodput: the highest request rate at which at least {workload['target_attainment']:.0%} of requests meet "
        f"{slo_text(workload)}. Workload: {workload['dataset']} prompts ({workload['input_len']} ± "
        f"{workload['range_ratio']:.0%}), {workload['output_len']} output tokens, Poisson arrivals, "
        f"at each rate at least {workload['num_prompts']} requests and {workload['duration_s']:g} s of arrivals, "
        f"fresh prompts each time; {workload['repeats']} search(es) a system. "
        f"Servers on CPUs {combined['pinning']['server_cpus']}, client on {combined['pinning']['client_cpus']}; "
        f"{combined['date']}.", "",
        "| system | goodput (req/s) | per repeat | " + " | ".join(f"÷ {name}" for name in names) + " |",
        "|---|---|---|" + "---|" * len(names)]
    for name, entry in systems.items():
        if entry["status"] != "ok":
            lines.append(f"| {name} | {entry['status']}: {entry['reason'].splitlines()[0][:120]} | | "
                         + "| " * len(names))
            continue
        per_repeat = ", ".join(_bound(search["goodput"] or 0.0, search["at_least"]) for search in entry["repeats"])
        lines.append(f"| {name} | {_bound(entry['goodput'], entry['at_least'])} | {per_repeat} | "
                     + " | ".join(ratio(entry["goodput"], systems[other]["goodput"]) for other in names) + " |")
    lines += _idle_table(systems)
    lines += ["", "A goodput of 0: even the lowest rate missed the target; ≥ R: the highest rate measured, R, met it "
              "(so a ratio involving it is a bound, not a measure).", ""]
    for name in names:
        points = [(repeat, point) for repeat, search in enumerate(systems[name]["repeats"])
                  for point in sorted(search["points"], key=lambda point: point["request_rate"])]
        with_engines = any(point["figures"].get("engines") for _, point in points)
        lines += [f"## {name}", "", systems[name]["description"], "",
                  "| repeat | rate (req/s) | met SLOs | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p99 / max (ms) "
                  "| output tok/s | failed |" + (" engines busy (% of the run, by step) |" if with_engines else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if with_engines else "")]
        for repeat, point in points:
            f = point["figures"]
            lines.append(
                f"| {repeat} | {point['request_rate']:g} | {point['attainment']:.0%} | "
                f"{f['median_ttft_ms']:.0f} / {f['p99_ttft_ms']:.0f} | {f['median_tpot_ms']:.0f} / "
                f"{f['p99_tpot_ms']:.0f} | {f['p99_itl_ms']:.0f} / {f['max_itl_ms']:.0f} | "
                f"{f['output_throughput']:.1f} | {f['failed']} |"
                + (f" {busy_text(f.get('engines') or {}, f['duration'])} |" if with_engines else ""))
        lines.append("")
    return "\n".join(lines)


def plot_attainment(combined: dict, path: Path) -> None:
    workload = combined["workload"]
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for color, (name, entry) in enumerate(measured(combined["systems"]).items()):
        for repeat, search in enumerate(entry["repeats"]):
            points = sorted(search["points"], key=lambda point: point["request_rate"])
            axes.plot([p["request_rate"] for p in points], [100 * p["attainment"] for p in points], marker="o",
                      color=f"C{color}", alpha=1.0 if repeat == 0 else 0.5,
                      label=f"{name} (goodput {entry['goodput']:g})" if repeat == 0 else None)
    axes.axhline(100 * workload["target_attainment"], color="grey", linestyle="--", label="target")
    axes.set(xlabel="request rate (req/s)", ylabel="requests meeting every SLO (%)", ylim=(-2, 102))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.suptitle(f"{combined['model']['dir']}, {workload['dtype']}\nrequests meeting {slo_text(workload)}",
                    fontsize=10)
    figure.savefig(path, dpi=100)


def _idle_table(systems: dict) -> list[str]:
    """Means in ms over requests sent one at a time; "—" where a server does not report a part."""
    rows = [(name, entry["idle"]) for name, entry in measured(systems).items() if entry.get("idle")]
    if not rows:
        return []
    lines = ["", "At idle (one request at a time, means in ms; the server's parts from its /metrics):", "",
             "| system | " + " | ".join(title for _, title in IDLE_COLUMNS) + " |",
             "|---|" + "---|" * len(IDLE_COLUMNS)]
    for name, idle in rows:
        cells = ["—" if idle.get(key) is None else f"{idle[key]:.0f}" for key, _ in IDLE_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _bound(goodput: float, at_least: bool) -> str:
    return f"≥ {goodput:g}" if at_least else f"{goodput:g}"
