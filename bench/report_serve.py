"""The report of one `pdserve bench serve` run, from its JSON (`BenchResult.to_json_dict()`):
<label>.md laid out like vLLM's "Serving Benchmark Result" (run figures, a latency table in
milliseconds, errors, then what the server reported) and <label>_latency_cdf.png."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from pdserve.bench.metrics import LATENCY_METRICS, PERCENTILES
from pdserve.bench.plots import plot_latency_cdf

MAX_ERRORS_SHOWN = 5
RUN_ROWS = (
    ("Successful requests", "completed"),
    ("Failed requests", "failed"),
    ("Request rate (req/s)", "request_rate"),
    ("Burstiness", "burstiness"),
    ("Maximum request concurrency", "max_concurrency"),
    ("Benchmark duration (s)", "duration"),
    ("Total input tokens", "total_input_tokens"),
    ("Total generated tokens", "total_output_tokens"),
    ("Request throughput (req/s)", "request_throughput"),
    ("Request goodput (req/s)", "request_goodput"),
    ("Output token throughput (tok/s)", "output_throughput"),
    ("Peak output token throughput (tok/s)", "max_output_tokens_per_s"),
    ("Peak concurrent requests", "max_concurrent_requests"),
    ("Total token throughput (tok/s)", "total_token_throughput"),
)


def write_report(result: dict, json_path: Path) -> str:
    """<label>.md and <label>_latency_cdf.png beside `json_path`; the markdown."""
    markdown = render_markdown(result)
    json_path.with_suffix(".md").write_text(markdown)
    plot_latency_cdf(result, json_path.with_name(f"{json_path.stem}_latency_cdf.png"))
    return markdown


def render_markdown(result: dict) -> str:
    lines = [f"## Serving Benchmark Result: {result['label']}", "",
             f"{result.get('backend', 'openai')} → `{result['target']}`, model `{result['model_id']}`, "
             f"{result['num_prompts']} prompts, {result['date']}", "",
             "| Metric | Value |", "|---|---:|"]
    for title, key in RUN_ROWS:
        if key == "request_goodput" and result[key] is None:
            continue
        lines.append(f"| {title} | {_number(result[key])} |")
    lines += ["", "| Latency (ms) | Mean | Median | Std | " + " | ".join(f"P{p}" for p in PERCENTILES) + " |",
              "|---|" + "---:|" * (3 + len(PERCENTILES))]
    for metric in LATENCY_METRICS:
        values = [result[f"{stat}_{metric}_ms"] for stat in ("mean", "median", "std")]
        values += [result[f"p{p}_{metric}_ms"] for p in PERCENTILES]
        lines.append(f"| {metric.upper()} | " + " | ".join(f"{value:.2f}" for value in values) + " |")
    errors = Counter(error for error in result["errors"] if error)
    if errors:
        lines += ["", "| Error | Requests |", "|---|---:|"]
        lines += [f"| {_cell(error)} | {count} |" for error, count in errors.most_common(MAX_ERRORS_SHOWN)]
    if result.get("server"):
        lines += ["", *_server_lines(result["server"])]
    return "\n".join(lines) + "\n"


def _server_lines(server: dict) -> list[str]:
    lines = ["### Server"]
    if "metrics_url" in server:
        lines += ["", f"Scraped `{server['metrics_url']}` before and after the run."]
    if server.get("scrape_errors"):
        lines += ["", f"Scrape errors: {'; '.join(server['scrape_errors'])}."]
    rows = [(f"`{key}` increase", _figure(value)) for key, value in server.get("counters", {}).items() if value]
    rows += [(f"`{key}` mean of {figures['count']:g}", _figure(figures["mean"]))
             for key, figures in server.get("histograms", {}).items() if figures["count"]]
    if requests := server.get("requests"):
        rows += [(f"{name} (GetRequest)", ", ".join(f"{key}: {count}" for key, count in requests[name].items()))
                 for name in ("states", "transports")]
        rows += [("KV bytes per request (GetRequest)", _figure(requests["kv_bytes_per_request"])),
                 ("KV transfer GB/s (GetRequest)", _figure(requests["kv_transfer_gb_per_s"]))]
    if rows:
        lines += ["", "| Figure | Value |", "|---|---:|", *(f"| {name} | {value} |" for name, value in rows)]
    return lines


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
