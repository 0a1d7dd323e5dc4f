"""A measured profile of one model on one device: step-time fits, KV size, transfer bandwidth.

Invariant: every figure here was measured on the device, and `fit_linear` only turns samples into
coefficients; nothing is tuned to a benchmark the planner is later checked against. Step times:

    prefill step_s = intercept_s + per_token_s * batch_tokens
                     + per_attention_pair_s * sum(chunk_len * (chunk_start + chunk_len))
    decode step_s  = intercept_s + per_seq_s * num_seqs + per_context_token_s * context_tokens

Fits minimise relative error (each sample's row is divided by its time), so short steps count as
much as long ones, and keep coefficients non-negative (a term whose weight comes out negative is
dropped and the rest refitted): a fit never predicts a step faster with more work. A profile is
read only at its own `SCHEMA_VERSION`: an older one's figures mean other things.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 6


def fit_linear(features: list[list[float]], targets: list[float]) -> list[float]:
    """Non-negative least squares of the relative error, by elimination: one coefficient per
    column of `features` (add a column of ones for an intercept); targets must be positive."""
    y = np.asarray(targets, dtype=float)
    if (y <= 0).any():
        raise ValueError("targets must be positive")
    x = np.asarray(features, dtype=float) / y[:, None]
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
class PrefillSample:
    num_seqs: int
    prompt_len: int  # every prompt of the batch has this length
    step_s: float  # median of the timed repeats


@dataclass(frozen=True, slots=True)
class DecodeSample:
    num_seqs: int
    num_context_tokens: int  # prompt tokens summed over the batch (the few generated while timing left out)
    step_s: float  # median of the timed repeats


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
        return PrefillFit(*fit_linear([[1.0, s.num_seqs * s.prompt_len, s.num_seqs * s.prompt_len ** 2]
                                       for s in samples], [s.step_s for s in samples]))


@dataclass(frozen=True, slots=True)
class DecodeFit:
    intercept_s: float
    per_seq_s: float
    per_context_token_s: float

    def step_s(self, num_seqs: int, num_context_tokens: int) -> float:
        return self.intercept_s + self.per_seq_s * num_seqs + self.per_context_token_s * num_context_tokens

    @staticmethod
    def fit(samples: list[DecodeSample]) -> DecodeFit:
        return DecodeFit(*fit_linear(
            [[1.0, s.num_seqs, s.num_context_tokens] for s in samples], [s.step_s for s in samples]))


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
    prefill_samples: list[PrefillSample] = field(default_factory=list)
    decode_samples: list[DecodeSample] = field(default_factory=list)

    def transfer_s(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token / (self.transfer_gb_per_s * 1e9)

    def to_json_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json_dict(), indent=2) + "\n")
        return path

    @staticmethod
    def load(path: Path) -> Profile:
        data = json.loads(Path(path).read_text())
        if (version := data.pop("schema_version", None)) != SCHEMA_VERSION:
            raise ValueError(f"profile schema {version!r}, expected {SCHEMA_VERSION}: an earlier planner's profile; "
                             "make a new one with `pdserve plan profile`")
        return Profile(**{**data, "prefill": PrefillFit(**data["prefill"]), "decode": DecodeFit(**data["decode"]),
                          "prefill_samples": [PrefillSample(**s) for s in data["prefill_samples"]],
                          "decode_samples": [DecodeSample(**s) for s in data["decode_samples"]]})
