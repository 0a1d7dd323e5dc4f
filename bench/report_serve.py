"""The report of one `pdserve bench serve` run, from its JSON (`BenchResult.to_json_dict()`):
<label>.md laid out like vLLM's "Serving Benchmark Result" (run figures, a latency table in ms,
errors, what the server reported) and <label>_latency_cdf.png, drawn with `Figure`, never pyplot.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from pdserve.bench.metrics import LATENCY_METRICS, PERCENTILES

MAX_ERRORS_SHOWN = 5
RUN_ROWS = (("Successful requests", "completed"), ("Failed requests", "failed"),
            ("Request rate (req/s)", "request_rate"), ("Maximum request concurrency", "max_concurrency"),
            ("Benchmark duration (s)", "duration"), ("Total input tokens", "total_input_tokens"),
            ("Total generated tokens", "total_output_tokens"), ("Request throughput (req/s)", "request_throughput"),
            ("Request goodput (req/s)", "request_goodput"), ("Output token throughput (tok/s)", "output_throughput"),
            ("Peak output token throughput (tok/s)", "max_output_tokens_per_s"),
            ("Peak concurrent requests", "max_concurrent_requests"),
            ("Total token throughput (tok/s)", "total_token_throughput"))


def write_report(result: dict, json_path: Path) -> str:
    """<label>.md and <label>_latency_cdf.png beside `json_path`; the markdown."""
    markdown = render_markdown(result)
    json_path.with_suffix(".md").write_text(markdown)
    plot_latency_cdf(result, json_path.with_name(f"{json_path.stem}_latency_cdf.png"))
    return markdown


def render_markdown(result: dict) -> str:
    lines = [f"## Serving Benchmark Result: {result['label']}", "",
             f"{result['backend']} → `{result['target']}`, model `{result['model_id']}`, "
             f"{result['num_prompts']} prompts, {result['date']}", "", "| Metric | Value |", "|---|---:|"]
    lines += [f"| {title} | {_number(result[key])} |" for title, key in RUN_ROWS
              if key != "request_goodput" or result[key] is not None]
    lines += ["", "| Latency (ms) | Mean | Median | Std | " + " | ".join(f"P{p}" for p in PERCENTILES) + " |",
              "|---|" + "---:|" * (3 + len(PERCENTILES))]
    for metric in LATENCY_METRICS:
        keys = [f"{stat}_{metric}_ms" for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))]
        lines.append(f"| {metric.upper()} | " + " | ".join(f"{result[key]:.2f}" for key in keys) + " |")
    if errors := Counter(" ".join(error.split()).replace("|", "\\|") for error in result["errors"] if error):
        lines += ["", "| Error | Requests |", "|---|---:|"]
        lines += [f"| {error} | {count} |" for error, count in errors.most_common(MAX_ERRORS_SHOWN)]
    if result.get("server"):
        lines += ["", *_server_lines(result["server"])]
    return "\n".join(lines) + "\n"


def plot_latency_cdf(result: dict, path: Path) -> None:
    """TTFT, ITL and E2EL empirical CDFs (milliseconds) of the successful requests."""
    succeeded = [i for i, error in enumerate(result["errors"]) if not error]
    samples_ms = {"TTFT": [result["ttfts"][i] * 1000 for i in succeeded],
                  "ITL": [gap * 1000 for i in succeeded for gap in result["itls"][i]],
                  "E2EL": [result["e2els"][i] * 1000 for i in succeeded]}
    figure = Figure(figsize=(13, 4), layout="constrained")
    for axes, (name, values) in zip(figure.subplots(1, 3), samples_ms.items()):
        if values:
            axes.step(np.sort(values), np.arange(1, len(values) + 1) / len(values), where="post")
        axes.set(title=f"{name} ({len(values)} samples)", xlabel=f"{name} (ms)", ylabel="fraction ≤ x",
                 ylim=(0, 1.02))
        axes.grid(alpha=0.3)
    figure.suptitle(f"{result['label']}: latency CDFs")
    figure.savefig(path, dpi=100)


def _server_lines(server: dict) -> list[str]:
    lines = ["### Server"]
    if "metrics_url" in server:
        lines += ["", f"Scraped `{server['metrics_url']}` before and after the run."]
    if server.get("scrape_errors"):
        lines += ["", f"Scrape errors: {'; '.join(server['scrape_errors'])}."]
    rows = [(f"`{key}` increase", _figure(value)) for key, value in server.get("counters", {}).items() if value]
    rows += [(f"`{key}` mean of {figures['count']:g}", _figure(figures["mean"]))
             for key, figures in server.get("histograms", {}).items() if figures["count"]]
    rows += [(f"`{key}` after the run", _figure(value)) for key, value in server.get("gauges", {}).items() if value]
    rows += [(f"{key} (GetRequest)", ", ".join(f"{name}: {count}" for name, count in value.items())
              if isinstance(value, dict) else _figure(value)) for key, value in server.get("requests", {}).items()]
    if rows:
        lines += ["", "| Figure | Value |", "|---|---:|", *(f"| {name} | {value} |" for name, value in rows)]
    return lines


def _number(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"
