"""PNG plots of benchmark results, drawn from their JSON form.

Figures are built with `matplotlib.figure.Figure` directly, never pyplot: no global backend or
figure state, so plotting works headless and in any process.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def plot_latency_cdf(result: dict, path: Path) -> Path:
    """TTFT, ITL and E2EL empirical CDFs (milliseconds) of the successful requests."""
    succeeded = [i for i, error in enumerate(result["errors"]) if not error]
    samples_ms = {
        "TTFT": [result["ttfts"][i] * 1000 for i in succeeded],
        "ITL": [gap * 1000 for i in succeeded for gap in result["itls"][i]],
        "E2EL": [result["e2els"][i] * 1000 for i in succeeded],
    }
    figure = Figure(figsize=(13, 4), layout="constrained")
    for axes, (name, values) in zip(figure.subplots(1, 3), samples_ms.items()):
        if values:
            ordered = np.sort(values)
            axes.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post")
        axes.set(title=f"{name} ({len(values)} samples)", xlabel=f"{name} (ms)", ylabel="fraction ≤ x", ylim=(0, 1.02))
        axes.grid(alpha=0.3)
    figure.suptitle(f"{result['label']}: latency CDFs")
    figure.savefig(path, dpi=100)
    return path


def plot_grouped_bars(panels: dict[str, dict[str, dict[str, float]]], title: str, path: Path) -> Path:
    """One panel per key of `panels` ({panel title: {group: {bar: value}}}): a cluster of labelled
    bars per group, the same bar names in the same colours across groups and panels."""
    bar_names = list(dict.fromkeys(bar for groups in panels.values() for bars in groups.values() for bar in bars))
    figure = Figure(figsize=(5 * len(panels), 4), layout="constrained")
    for axes, (panel_title, groups) in zip(np.atleast_1d(figure.subplots(1, len(panels))), panels.items()):
        width = 0.8 / len(bar_names)
        for offset, bar in enumerate(bar_names):
            positions = [index + offset * width for index, bars in enumerate(groups.values()) if bar in bars]
            values = [bars[bar] for bars in groups.values() if bar in bars]
            drawn = axes.bar(positions, values, width, label=bar, color=f"C{offset}")
            axes.bar_label(drawn, fmt="%.0f", fontsize=8)
        axes.set_xticks([index + width * (len(bar_names) - 1) / 2 for index in range(len(groups))], list(groups))
        axes.set(title=panel_title)
        axes.legend(fontsize=8)
        axes.grid(alpha=0.3, axis="y")
    figure.suptitle(title)
    figure.savefig(path, dpi=100)
    return path
