"""The report of a `pdserve bench goodput` run: goodput.md and goodput.png from goodput.json.

A pure function of the JSON (`pdserve bench report` redraws them). The markdown states each system's goodput (the median over repeats, each repeat's beside it), its
ratio to every other system's, and every measured point; the plot draws attainment against
request rate, one line per system and repeat, with the target as a horizontal line.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

JSON_NAME, MARKDOWN_NAME, PLOT_NAME = "goodput.json", "goodput.md", "goodput.png"


def write_report(combined: dict, result_dir: Path) -> None:
    (result_dir / MARKDOWN_NAME).write_text(render_markdown(combined))
    plot_attainment(combined, result_dir / PLOT_NAME)


def render_markdown(combined: dict) -> str:
    workload, systems = combined["workload"], combined["systems"]
    slos = ", ".join(f"{key.upper()} ≤ {value:g} ms" for key, value in workload["slos_ms"].items())
    lines = [
        f"# Goodput: {combined['model']['dir']}, {workload['dtype']}",
        "",
        f"Goodput: the highest request rate at which at least {workload['target_attainment']:.0%} of requests meet "
        f"{slos}. Workload: {workload['dataset']} prompts ({workload['input_len']} ± "
        f"{workload['range_ratio']:.0%}), {workload['output_len']} output tokens, Poisson arrivals, "
        f"at each rate at least {workload['num_prompts']} requests and {workload['duration_s']:g} s of arrivals, "
        f"fresh prompts each time; {workload['repeats']} search(es) a system. "
        f"Servers on CPUs {combined['pinning']['server_cpus']}, client on {combined['pinning']['client_cpus']}; "
        f"{combined['date']}.",
        "",
        "| system | goodput (req/s) | per repeat | " + " | ".join(f"÷ {name}" for name in _measured(systems)) + " |",
        "|---|---|---|" + "---|" * len(_measured(systems)),
    ]
    for name, entry in systems.items():
        if entry["status"] != "ok":
            lines.append(f"| {name} | {entry['status']}: {entry['reason'].splitlines()[0][:120]} | | "
                         + "| " * len(_measured(systems)))
            continue
        ratios = [_ratio(entry["goodput"], systems[other]["goodput"]) for other in _measured(systems)]
        per_repeat = ", ".join(_bound(search["goodput"] or 0.0, search["at_least"]) for search in entry["repeats"])
        lines.append(f"| {name} | {_bound(entry['goodput'], entry['at_least'])} | {per_repeat} | "
                     + " | ".join(ratios) + " |")
    lines += _idle_table(systems)
    lines += ["", "A goodput of 0: even the lowest rate missed the target; ≥ R: the highest rate measured, R, met it "
              "(so a ratio involving it is a bound, not a measure).", ""]
    for name in _measured(systems):
        lines += [f"## {name}", "", systems[name]["description"], "",
                  "| repeat | rate (req/s) | met SLOs | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p99 / max (ms) "
                  "| output tok/s | failed |",
                  "|---|---|---|---|---|---|---|---|"]
        for repeat, search in enumerate(systems[name]["repeats"]):
            for point in sorted(search["points"], key=lambda point: point["request_rate"]):
                f = point["figures"]
                lines.append(
                    f"| {repeat} | {point['request_rate']:g} | {point['attainment']:.0%} | "
                    f"{f['median_ttft_ms']:.0f} / {f['p99_ttft_ms']:.0f} | {f['median_tpot_ms']:.0f} / "
                    f"{f['p99_tpot_ms']:.0f} | {f['p99_itl_ms']:.0f} / {f['max_itl_ms']:.0f} | "
                    f"{f['output_throughput']:.1f} | {f['failed']} |")
        lines.append("")
    return "\n".join(lines)


def plot_attainment(combined: dict, path: Path) -> Path:
    workload = combined["workload"]
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for color, name in enumerate(_measured(combined["systems"])):
        entry = combined["systems"][name]
        for repeat, search in enumerate(entry["repeats"]):
            points = sorted(search["points"], key=lambda point: point["request_rate"])
            axes.plot([p["request_rate"] for p in points], [100 * p["attainment"] for p in points], marker="o",
                      color=f"C{color}", alpha=1.0 if repeat == 0 else 0.5,
                      label=f"{name} (goodput {entry['goodput']:g})" if repeat == 0 else None)
    axes.axhline(100 * workload["target_attainment"], color="grey", linestyle="--", label="target")
    axes.set(xlabel="request rate (req/s)", ylabel="requests meeting every SLO (%)", ylim=(-2, 102))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    slos = ", ".join(f"{key.upper()} ≤ {value:g} ms" for key, value in workload["slos_ms"].items())
    figure.suptitle(f"{combined['model']['dir']}, {workload['dtype']}\nrequests meeting {slos}", fontsize=10)
    figure.savefig(path, dpi=100)
    return path


IDLE_COLUMNS = (("client_ttft_ms", "TTFT at the client"), ("server_ttft_ms", "TTFT at the server"),
                ("server_queue_ms", "queue (to the prefilling engine)"),
                ("server_prefill_ms", "prefill (to its first token)"),
                ("kv_transfer_ms", "KV hand-off"), ("second_token_ms", "first to second token"))


def _idle_table(systems: dict) -> list[str]:
    """Means in ms over requests sent one at a time; "—" where a server does not report a part."""
    rows = [(name, systems[name]["idle"]) for name in _measured(systems) if systems[name].get("idle")]
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


def _measured(systems: dict) -> list[str]:
    return [name for name, entry in systems.items() if entry["status"] == "ok"]


def _ratio(value: float, other: float) -> str:
    return f"{value / other:.2f}x" if other else ("—" if not value else "∞")

