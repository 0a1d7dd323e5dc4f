"""`pdserve bench WORKLOAD`: the one way to start a measurement, or to redraw its report.

Each workload is a module with `add_arguments(parser)` and `run(args)`, imported only when its
own flags are parsed, so `pdserve bench --help` loads no torch.
"""
from __future__ import annotations

import argparse
import importlib

WORKLOADS = {  # name -> (module, what it measures)
    "goodput": ("goodput", "the headline: start each system, climb request rates, goodput under TTFT/TPOT SLOs"),
    "serve": ("serve", "one run at a request rate or concurrency cap, like `vllm bench serve`"),
    "offline": ("offline", "the engines alone: pdserve's LLM.generate against vLLM's, same prompts"),
    "decode-step": ("profile_decode_step", "one engine decode step split into its parts, against its read roofline"),
    "decode-kernel": ("decode_kernel", "the decode attention kernel (CPU or GPU) on scattered KV blocks"),
    "kv-transfer": ("kv_transfer", "KV transport bandwidth between a prefill and a decode pool (CPU or GPU)"),
    "report": ("report", "markdown tables, plots and the headline's goals from result JSON (no measuring)"),
}


class _WorkloadParser(argparse.ArgumentParser):
    """A workload's parser: its module declares the flags the first time it parses."""

    def __init__(self, *args, workload: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._workload = workload

    def parse_known_args(self, args=None, namespace=None):
        if self._workload is not None:
            workload, self._workload = self._workload, None
            _module(workload).add_arguments(self)
        return super().parse_known_args(args, namespace)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Benchmarks. Every workload writes JSON; `report` redraws tables and plots from it."
    workloads = parser.add_subparsers(dest="workload", metavar="WORKLOAD", required=True,
                                      parser_class=_WorkloadParser)
    for name, (_, summary) in WORKLOADS.items():
        workloads.add_parser(name, help=summary, description=summary, workload=name)


def run(args: argparse.Namespace) -> int:
    return _module(args.workload).run(args)


def _module(workload: str):
    return importlib.import_module(f"pdserve.bench.{WORKLOADS[workload][0]}")
