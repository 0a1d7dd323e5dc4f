"""`pdserve bench report [RESULTS]`: every report redrawn from the result JSON, nothing measured.

    RESULTS/*/goodput.json  ─▶ goodput.md, goodput.png                 (bench.report_goodput)
    RESULTS/*/offline.json  ─▶ offline.md                              (bench.report_offline)
    RESULTS/*/<label>.json  ─▶ <label>.md, <label>_latency_cdf.png     (bench.report_serve)
    RESULTS/headline.md     ─▶ BENCHMARKS.md's headline and goals      (bench.report_headline),
                               also written between the markers of --benchmarks FILE
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdserve.bench import report_goodput, report_headline, report_offline, report_serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, nargs="?", default=Path("bench/results"), help="a folder of runs")
    parser.add_argument("--benchmarks", type=Path, metavar="FILE", help="also write the headline into FILE")


def run(args: argparse.Namespace) -> int:
    for path in sorted(args.results.glob("*/*.json")):
        result = json.loads(path.read_text())
        if path.name == report_goodput.JSON_NAME:
            report_goodput.write_report(result, path.parent)
        elif path.name == report_offline.RESULT_JSON_NAME:
            report_offline.write_report(result, path.parent)
        elif "ttfts" in result:
            report_serve.write_report(result, path)
        else:
            continue
        print(path)
    headline = report_headline.render(*report_headline.load(args.results))
    (args.results / "headline.md").write_text(headline + "\n")
    print(args.results / "headline.md")
    if args.benchmarks is not None:
        args.benchmarks.write_text(report_headline.replace_marked(args.benchmarks.read_text(), headline))
        print(args.benchmarks)
    return 0
