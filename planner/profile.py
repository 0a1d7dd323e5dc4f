"""A measured profile of one model on one device: step-time fits, KV size, transfer, overheads.

Invariant: every figure here was measured (engine steps timed on the device, a serving run
through `pdserve up`), and `fit_linear` only turns samples into coefficients; nothing is tuned
to a benchmark the planner is later checked against. Step times are linear models:

    prefill step_s = intercept_s + per_token_s * batch_tokens
                     + per_attention_pair_s * sum(chunk_len * (chunk_start + chunk_len))
    decode step_s  = intercept_s + per_seq_s * num_seqs + per_context_token_s * context_tokens
                     + per_join_s * requests joining the batch in that step (as served only)

Fits minimise relative error (each sample's row is divided by its time), so short steps count as
much as long ones, and coefficients are kept non-negative (a term whose weight comes out negative
is dropped and the rest refitted): a fit never predicts a step faster with more work.

A sample keeps every timed repeat beside their median: each repeat over its point's median is the
engine's step-to-step jitter (`prefill_step_ratios`, `decode_step_ratios`), which the simulation
draws from (planner/jitter.py). The ratio is to the point's median, not to the fit, because the
fit's error at a point is the same on every step there: a bias, not jitter.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.jitter import ratios_to_median

SCHEMA_VERSION = 3


def fit_linear(features: list[list[float]], targets: list[float], relative: bool = True) -> list[float]:
    """Non-negative least squares, by elimination: one coefficient per column of `features` (add
    a column of ones for an intercept). Of the relative error (targets must then be positive), or
    with `relative=False` of the absolute error."""
    y = np.asarray(targets, dtype=float)
    x = np.asarray(features, dtype=float)
    if relative:
        if (y <= 0).any():
            raise ValueError("targets must be positive")
        x = x / y[:, None]
        y = np.ones_like(y)
    active = list(range(x.shape[1]))
    while True:
        coefficients, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [index for index, value in zip(active, coefficients) if value < 0]
        if not negative:
            result = [0.0] * x.shape[1]
            for index, value in zip(active, coefficients):
                result[index] = float(value)
            return result
        active.remove(min(negative, key=lambda index: coefficients[active.index(index)]))


@dataclass(frozen=True, slots=True)
class PrefillFit:
    intercept_s: float
    per_token_s: float
    per_attention_pair_s: float

    def step_s(self, chunks: list[tuple[int, int]]) -> float:
        """`chunks`: (first position, tokens) of each prompt chunk in the step."""
        return (self.intercept_s + self.per_token_s * sum(n for _, n in chunks)
                + self.per_attention_pair_s * sum(n * (start + n) for start, n in chunks))

    @staticmethod
    def fit(samples: list[PrefillSample]) -> PrefillFit:
        return PrefillFit(*fit_linear(
            [[1.0, s.num_tokens, s.num_attention_pairs] for s in samples], [s.step_s for s in samples]))


@dataclass(frozen=True, slots=True)
class DecodeFit:
    intercept_s: float
    per_seq_s: float
    per_context_token_s: float
    per_join_s: float = 0.0  # the engine thread's reservation, commit and join of a request, as served

    def step_s(self, num_seqs: int, num_context_tokens: int, num_joins: int = 0) -> float:
        return (self.intercept_s + self.per_seq_s * num_seqs + self.per_context_token_s * num_context_tokens
                + self.per_join_s * num_joins)

    @staticmethod
    def fit(samples: list[DecodeSample]) -> DecodeFit:
        return DecodeFit(*fit_linear(
            [[1.0, s.num_seqs, s.num_context_tokens] for s in samples], [s.step_s for s in samples]))


@dataclass(frozen=True, slots=True)
class PrefillSample:
    num_seqs: int
    prompt_len: int  # every prompt of the batch has this length
    step_s: float  # median of the repeats
    timings_s: list[float] = field(default_factory=list)  # every timed repeat

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.prompt_len

    @property
    def num_attention_pairs(self) -> int:
        return self.num_seqs * self.prompt_len ** 2


@dataclass(frozen=True, slots=True)
class DecodeSample:
    num_seqs: int
    num_context_tokens: int  # prompt tokens summed over the batch (the few generated while timing left out)
    step_s: float  # median of the repeats
    timings_s: list[float] = field(default_factory=list)  # every timed repeat


@dataclass(frozen=True, slots=True)
class ServingOverhead:
    """What the serving path adds to the engine, measured through `pdserve up`
    (planner/serving.py); zeros for an engine-only profile."""

    gateway_s: float = 0.0  # per request, served one at a time before it reaches a prefill queue
    ttft_s: float = 0.0  # the rest of TTFT beyond the gateway and the prefill step, on an idle system
    handoff_s: float = 0.0  # the client's first token → KV landed at decode, beyond the copy itself
    step_s: float = 0.0  # per decode step at batch 1, beyond the engine step: serving's work on its thread
    # per decode step and running request beyond the first, beyond the engine step; negative where
    # a served step grows more slowly with its batch than the engine's fit (no less than
    # -decode.per_seq_s, so that a step never shrinks as its batch grows)
    per_seq_step_s: float = 0.0
    # each staggered request's TTFT beyond what the simulation gives it with every overhead above
    # (the median model): what a light load adds on the TTFT path beyond the CPU sharing the
    # simulation runs, drawn per request as a wait before the first token reaches the client
    ttft_delays_s: list[float] = field(default_factory=list)
    # each single request's E2EL - TTFT beyond the engine's steps, less the fitted line: the
    # per-request spread of its decode span, drawn as the spread of its handoff
    handoff_residuals_s: list[float] = field(default_factory=list)
    cpu: CpuSharing = CpuSharing()  # the work beside the engines on their cores
    samples: list[dict] = field(default_factory=list)  # the runs' requests it was read from
    cpu_samples: list[dict] = field(default_factory=list)  # the CPU readings `cpu` was read from
    engine_alone: dict = field(default_factory=dict)  # the engine's fits before the served ones replaced them


@dataclass(frozen=True, slots=True)
class Profile:
    hardware: dict  # device, CPU model or GPU name, threads
    model: dict  # folder, architecture, sizes, dtype
    max_num_batched_tokens: int  # the prefill token budget per step
    max_num_seqs: int
    kv_bytes_per_token: int
    transfer_gb_per_s: float
    prefill: PrefillFit
    decode: DecodeFit
    serving: ServingOverhead = ServingOverhead()
    prefill_samples: list[PrefillSample] = field(default_factory=list)
    decode_samples: list[DecodeSample] = field(default_factory=list)

    @property
    def prefill_step_ratios(self) -> list[float]:
        return _step_ratios(self.prefill_samples)

    @property
    def decode_step_ratios(self) -> list[float]:
        return _step_ratios(self.decode_samples)

    def transfer_s(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token / (self.transfer_gb_per_s * 1e9)

    def to_json_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json_dict(), indent=2) + "\n")
        return path

    @staticmethod
    def from_json_dict(data: dict) -> Profile:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"profile schema {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        return Profile(
            hardware=data["hardware"], model=data["model"], max_num_batched_tokens=data["max_num_batched_tokens"],
            max_num_seqs=data["max_num_seqs"], kv_bytes_per_token=data["kv_bytes_per_token"],
            transfer_gb_per_s=data["transfer_gb_per_s"], prefill=PrefillFit(**data["prefill"]),
            decode=DecodeFit(**data["decode"]), serving=ServingOverhead(
                **{**data["serving"], "cpu": _cpu_sharing(data["serving"]["cpu"])}),
            prefill_samples=[PrefillSample(**s) for s in data["prefill_samples"]],
            decode_samples=[DecodeSample(**s) for s in data["decode_samples"]])

    @staticmethod
    def load(path: Path) -> Profile:
        return Profile.from_json_dict(json.loads(Path(path).read_text()))


def _cpu_sharing(data: dict) -> CpuSharing:
    return CpuSharing(shares_replica_cpus=data["shares_replica_cpus"],
                      **{part: CpuDemand(**data[part]) for part in ("front", "prefill", "decode")})


def _step_ratios(samples: list[PrefillSample] | list[DecodeSample]) -> list[float]:
    """Every timed repeat over its point's median, over all points that kept their repeats."""
    return [ratio for sample in samples if sample.timings_s for ratio in ratios_to_median(sample.timings_s)]
