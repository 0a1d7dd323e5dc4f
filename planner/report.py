"""Markdown tables of simulations and fleet sweeps and the fleet plot, from their JSON form.

Plots use `matplotlib.figure.Figure` directly, as bench/plots.py does: no pyplot state.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure



def simulation_markdown(rows: list[dict]) -> str:
    lines = ["| config | p50 TTFT (ms) | p90 TTFT (ms) | p50 TPOT (ms) | p90 TPOT (ms) | goodput (req/s) | "
             "attainment |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['p50_ttft_ms']:.1f} | {r['p90_ttft_ms']:.1f} | {r['p50_tpot_ms']:.2f} | "
              f"{r['p90_tpot_ms']:.2f} | {r['goodput_rps']:.2f} | {r['slo_attainment']:.3f} |" for r in rows]
    return "\n".join(lines) + "\n"


def fleet_markdown(fleet: dict) -> str:
    lines = ["| GPUs | rate (req/s) | recommended | goodput (req/s) | per GPU | SLO attainment | "
             "p90 TTFT (ms) | p90 TPOT (ms) | worst split (goodput) |", "|---|---|---|---|---|---|---|---|---|"]
    for entry in fleet["fleets"]:
        best = entry["recommended"]
        worst = min(entry["candidates"], key=lambda c: c["goodput_rps"])
        lines.append(f"| {entry['num_gpus']} | {entry['request_rate']:g} | {best['config']} | "
                     f"{best['goodput_rps']:.1f} | {best['goodput_per_gpu_rps']:.2f} | {best['slo_attainment']:.3f} | "
                     f"{best['p90_ttft_ms']:.0f} | {best['p90_tpot_ms']:.1f} | "
                     f"{worst['config']} ({worst['goodput_rps']:.1f}) |")
    return "\n".join(lines) + "\n"


def plot_fleet(fleet: dict, path: Path) -> Path:
    """Goodput against the prefill share of each fleet, the recommended split starred."""
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2)
    for index, entry in enumerate(fleet["fleets"]):
        num_gpus = entry["num_gpus"]
        prefills = [c["num_prefill"] for c in entry["candidates"]]
        goodputs = [c["goodput_rps"] for c in entry["candidates"]]
        attainments = [c["slo_attainment"] for c in entry["candidates"]]
        best = entry["recommended"]
        color = f"C{index}"
        left.plot(prefills, goodputs, marker=".", color=color,
                  label=f"{num_gpus} GPUs ({entry['request_rate']:g} req/s)")
        left.plot([best["num_prefill"]], [best["goodput_rps"]], marker="*", markersize=14, color=color)
        right.plot([p / num_gpus for p in prefills], attainments, marker=".", color=color, label=f"{num_gpus} GPUs")
        right.plot([best["num_prefill"] / num_gpus], [best["slo_attainment"]], marker="*", markersize=14, color=color)
    left.set(title="goodput (★ recommended)", xlabel="prefill replicas P (decode = N - P)",
             ylabel="requests/s within both SLOs")
    right.set(title="SLO attainment", xlabel="prefill share P / N", ylabel="fraction within both SLOs",
              ylim=(-0.02, 1.02))
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    slo = fleet["slo"]
    figure.suptitle(f"xPyD recommendation from the profile of {fleet['profile']['hardware']['name']}: "
                    f"TTFT ≤ {slo['ttft_ms']:g} ms, TPOT ≤ {slo['tpot_ms']:g} ms")
    figure.savefig(path, dpi=100)
    return path
