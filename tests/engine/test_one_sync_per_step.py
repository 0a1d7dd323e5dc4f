"""A decode step makes two host-to-device copies and one readback, whatever its rows' sampling
params, and samples what each row alone would.

A real `ModelRunner` step (through the engine, on a tiny model) over a batch that mixes greedy,
temperature, top-k, top-p, min-p, seeded, penalised, biased and logprobs rows is instrumented:
`stage` must be called twice, nothing else may build a tensor on a device or move one there,
and exactly one readback (`tolist`, `item`, `cpu`, `numpy`, or a tensor's bool, int or float)
may happen. On CPU the attention kernels' pure-torch stand-ins (kernels/reference.py) read
context lengths back where CUDA runs Triton kernels; readbacks from kernels/ are not the step's.
"""
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from pdserve.engine import model_runner
from pdserve import kernels
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.protocol.sampling_params import SamplingParams
from tests.engine.sampling_on_cpu import sample
from tests.engine.test_logits_processors import plain, reference_row

KERNELS_DIR = str(Path(kernels.__file__).parent)
READBACKS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__")
HISTORY = [9, 9, 40, 7, 9, 300]  # output tokens each request resumes with, for the penalties to see
ROWS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.0, top_k=20),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "min_p": dict(temperature=1.0, min_p=0.05),
    "seeded": dict(temperature=1.2, seed=1234),
    "penalties": dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4),
    "greedy_penalties": dict(temperature=0.0, frequency_penalty=2.0, min_tokens=12, stop_token_ids=[5]),
    "logit_bias": dict(temperature=0.9, logit_bias={7: 5.0, 100: -100.0}),
    "logprobs": dict(temperature=0.0, logprobs=5),
    "random_logprobs": dict(temperature=1.0, top_k=50, top_p=0.9, logprobs=0),
}


@dataclass
class Traffic:
    """What crossed between host and device while instrumented."""
    stage_calls: int = 0
    in_stage: bool = False
    copies: list[str] = field(default_factory=list)  # "what at file:line": to a device outside `stage`
    readbacks: list[str] = field(default_factory=list)  # "what at file:line", outside kernels/


@dataclass(frozen=True)
class SampledRow:
    """One row of the step: the request as it stood before, and what the step gave it."""
    params: SamplingParams
    seed: int
    position: int
    prompt: list[int]
    output: list[int]
    logits: torch.Tensor  # [vocab_size] float32
    token_id: int
    logprobs: TokenLogprobs | None


def caller() -> str:
    """Where the instrumented call was made from."""
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def instrument(monkeypatch: pytest.MonkeyPatch) -> Traffic:
    """Records, until monkeypatch undoes it, the runner's `stage` calls, every tensor built on a
    device or moved to one outside them, and every readback."""
    traffic = Traffic()
    real_stage = model_runner.stage

    def stage(*args, **kwargs):
        traffic.stage_calls += 1
        traffic.in_stage = True
        try:
            return real_stage(*args, **kwargs)
        finally:
            traffic.in_stage = False

    def factory(name, real):
        def wrapper(*args, **kwargs):
            if not traffic.in_stage and kwargs.get("device") is not None:
                traffic.copies.append(f"torch.{name} at {caller()}")
            return real(*args, **kwargs)
        return wrapper

    def mover(name, real):
        def wrapper(self, *args, **kwargs):
            to_device = name == "cuda" or "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args)
            if not traffic.in_stage and to_device:
                traffic.copies.append(f"Tensor.{name} at {caller()}")
            return real(self, *args, **kwargs)
        return wrapper

    def readback(name, real):
        def wrapper(self, *args, **kwargs):
            where = caller()
            if not where.startswith(KERNELS_DIR):
                traffic.readbacks.append(f"Tensor.{name} at {where}")
            return real(self, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(model_runner, "stage", stage)
    for name in ("tensor", "as_tensor", "asarray"):
        monkeypatch.setattr(torch, name, factory(name, getattr(torch, name)))
    for name in ("to", "cuda"):
        monkeypatch.setattr(torch.Tensor, name, mover(name, getattr(torch.Tensor, name)))
    for name in READBACKS:
        monkeypatch.setattr(torch.Tensor, name, readback(name, getattr(torch.Tensor, name)))
    return traffic


@pytest.fixture(scope="module")
def decode_step(tiny_model) -> tuple[Traffic, int | None, list[SampledRow]]:
    """(traffic, EOS, rows) of one instrumented decode step over a batch holding every kind of row."""
    engine = LLMEngine(EngineConfig(model=tiny_model(), num_gpu_blocks=64, block_size=16))
    for n, (name, fields) in enumerate(ROWS.items()):
        params = SamplingParams(max_tokens=16, ignore_eos=True, **fields)
        engine.add_request(name, list(range(10 + n, 30 + 2 * n)), params,
                           output_token_ids=HISTORY[:n % len(HISTORY) + 1])
    engine.step()  # prefill; every request then decodes
    output = engine.scheduler.schedule()
    assert output.num_decode_chunks == len(output.chunks) == len(ROWS)
    requests = [chunk.request for chunk in output.chunks]
    before = [(r.params, r.seed, r.num_tokens, list(r.prompt_token_ids), list(r.output_token_ids))
              for r in requests]

    model, captured = engine.runner.model, []

    def compute_logits(hidden: torch.Tensor) -> torch.Tensor:
        captured.append(type(model).compute_logits(model, hidden))
        return captured[-1]

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(model, "compute_logits", compute_logits)
        traffic = instrument(monkeypatch)
        result = engine.runner.run(output)
    [logits] = captured  # [len(ROWS), vocab_size]
    rows = [SampledRow(*state, logits[i], result.sampled[r.request_id], result.logprobs[r.request_id])
            for i, (r, state) in enumerate(zip(requests, before))]
    return traffic, engine.eos_token_id, rows


def test_a_decode_step_stages_twice_and_reads_back_once(decode_step):
    traffic, _, _ = decode_step
    assert traffic.stage_calls == 2
    assert traffic.copies == []
    assert len(traffic.readbacks) == 1, traffic.readbacks


def test_each_row_samples_what_it_would_alone_with_raw_logprobs(decode_step):
    _, eos, rows = decode_step
    for row in rows:
        processed = reference_row(row.logits, row.params, row.prompt, row.output, eos)[None]  # [1, vocab_size]
        alone = sample(processed, [plain(row.params)], [row.seed], [row.position])
        assert row.token_id == alone.token_ids[0]
        if row.params.logprobs is None:
            assert row.logprobs is None
            continue
        raw = row.logits.log_softmax(dim=-1)  # [vocab_size]
        top = raw.topk(row.params.logprobs)
        assert row.logprobs.token_id == row.token_id
        assert row.logprobs.logprob == pytest.approx(raw[row.token_id].item(), abs=1e-6)
        assert row.logprobs.top_ids == tuple(top.indices.tolist())
        assert row.logprobs.top_logprobs == pytest.approx(tuple(top.values.tolist()), abs=1e-6)
