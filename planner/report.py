"""Markdown tables of simulations and fleet sweeps, and the fleet plot (`Figure`, never pyplot)."""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure


def simulation_markdown(rows: list[dict]) -> str:
    lines = ["| config | p50 TTFT (ms) | p90 TTFT (ms) | p50 TPOT (ms) | p90 TPOT (ms) | goodput (req/s) | "
             "attainment |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['median_ttft_ms']:.1f} | {r['p90_ttft_ms']:.1f} | {r['median_tpot_ms']:.2f} | "
              f"{r['p90_tpot_ms']:.2f} | {r['request_goodput']:.2f} | {r['slo_attainment']:.3f} |" for r in rows]
    return "\n".join(lines) + "\n"


def fleet_markdown(fleet: dict) -> str:
    lines = ["| GPUs | rate (req/s) | recommended | goodput (req/s) | SLO attainment | p90 TTFT (ms) | p90 TPOT (ms) "
             "| worst split (goodput) |", "|---|---|---|---|---|---|---|---|"]
    for entry in fleet["fleets"]:
        best, worst = entry["recommended"], min(entry["candidates"], key=lambda c: c["request_goodput"])
        lines.append(f"| {entry['num_gpus']} | {entry['request_rate']:g} | {best['config']} | "
                     f"{best['request_goodput']:.1f} | {best['slo_attainment']:.3f} | {best['p90_ttft_ms']:.0f} | "
                     f"{best['p90_tpot_ms']:.1f} | {worst['config']} ({worst['request_goodput']:.1f}) |")
    return "\n".join(lines) + "\n"


def plot_fleet(fleet: dict, path: Path) -> Path:
    """Goodput and SLO attainment against the prefill share of each fleet, the recommended split starred."""
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    axes = figure.subplots(1, 2)
    for index, entry in enumerate(fleet["fleets"]):
        shares = [c["num_prefill"] / entry["num_gpus"] for c in entry["candidates"]]
        best = entry["recommended"]
        for side, key in zip(axes, ("request_goodput", "slo_attainment")):
            side.plot(shares, [c[key] for c in entry["candidates"]], marker=".", color=f"C{index}",
                      label=f"{entry['num_gpus']} GPUs ({entry['request_rate']:g} req/s)")
            side.plot([best["num_prefill"] / entry["num_gpus"]], [best[key]], marker="*", markersize=14,
                      color=f"C{index}")
    axes[0].set(title="goodput (★ recommended)", xlabel="prefill share P / N", ylabel="requests/s within both SLOs")
    axes[1].set(title="SLO attainment", xlabel="prefill share P / N", ylabel="share within both SLOs",
                ylim=(-0.02, 1.02))
    for side in axes:
        side.grid(alpha=0.3)
        side.legend(fontsize=8)
    slos = fleet["slos_ms"]
    figure.suptitle(f"xPyD recommendation from the profile of {fleet['profile']['hardware']['name']}: "
                    f"TTFT ≤ {slos['ttft']:g} ms, TPOT ≤ {slos['tpot']:g} ms")
    figure.savefig(path, dpi=100)
    return path
