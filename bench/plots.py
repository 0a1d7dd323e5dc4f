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
