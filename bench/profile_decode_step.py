"""Where one decode step of the engine spends its time, against the step's memory roofline.

    pdserve bench decode-step --dtype bfloat16 --batch-sizes 1,8,32 --threads 1
    pdserve bench decode-step --dtype bfloat16 --batch-sizes 1,16 --enforce-eager
    pdserve bench decode-step --model FILE.gguf --dtype bfloat16 --quantized-weights as-stored --threads 1
    pdserve bench decode-step --dtype bfloat16 --kv-cache-dtype int8 --batch-sizes 32 --context-len 1000
    pdserve bench decode-step --dtype bfloat16 --quantization w8a8 --batch-sizes 1,16
    pdserve bench decode-step --device cuda --model tiny --batch-sizes 1,32,64
    pdserve bench decode-step --dtype bfloat16 --batch-sizes 16 --structured-output json

`--batch-sizes` sequences of `--context-len` prompt tokens are prefilled, then `--steps` decode
steps run through `LLMEngine.step`, each part timed by wrapping it on this run's objects (on a
GPU synchronising around it): Linear layers (LM head apart), decode attention, KV writes; "other
in the forward" is the rest of it, "step bookkeeping" the step less the runner. Where a CPU runs
decode steps as a plan (engine/cpu_decode_plan.py), which calls its kernels directly, the forward
is timed whole; `--enforce-eager` splits it through the modules. The roofline is
what a step must read once, the weights and every sequence's K and V, divided by the device's
read bandwidth (`bench.bandwidth`, on the same threads): a step can be no faster.

With `--structured-output json` every sequence answers under LONG_JSON_SCHEMA (a long array of
small objects, so none ends within the steps), and the token masks its grammar computes each step
are part of "sampling and input preparation".
"""
from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

import torch

from pdserve import kernels
from pdserve.bench.bandwidth import read_gbps, synchronize
from pdserve.engine import LLM, SamplingParams
from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.cpu_linear import PackedLinear
from pdserve.engine.engine_config import KV_CACHE_DTYPES, QUANTIZATIONS, QUANTIZED_WEIGHTS
from pdserve.engine.int8_linear import Int8Linear
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.structured_output import StructuredOutput

LONG_JSON_SCHEMA = {"type": "array", "minItems": 200, "items": {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"}},
    "required": ["name", "age", "role", "active"], "additionalProperties": False}}
STRUCTURED_OUTPUTS = {"none": None, "json": StructuredOutput(json=LONG_JSON_SCHEMA)}


class PartTimer:
    """Seconds per part, summed over the calls of each method wrapped; `undo` unwraps them all."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._device, self._undo = device, []

    def wrap(self, owner: object, attribute: str, part: str) -> None:
        inner, had_own = getattr(owner, attribute), attribute in vars(owner)

        def timed(*args, **kwargs):
            synchronize(self._device)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                synchronize(self._device)
                self.seconds[part] += time.perf_counter() - start

        setattr(owner, attribute, timed)
        self._undo.append(lambda: setattr(owner, attribute, inner) if had_own else delattr(owner, attribute))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def start_decode_batch(engine: LLMEngine, num_seqs: int, context_len: int, max_tokens: int, tag: str,
                       structured_output: StructuredOutput | None = None) -> list[str]:
    """`num_seqs` greedy requests of `context_len` random prompt tokens (seeded by `num_seqs`),
    ids "TAG-I", stepped until every prompt is computed and all of them decode; their ids."""
    generator = torch.Generator().manual_seed(num_seqs)
    request_ids = [f"{tag}-{i}" for i in range(num_seqs)]
    params = (SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_output=structured_output)
              if structured_output else SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    for request_id in request_ids:
        prompt = torch.randint(0, engine.model_config.vocab_size, (context_len,), generator=generator).tolist()
        engine.add_request(request_id, prompt, params)
    scheduler = engine.scheduler
    while scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running):
        engine.step()
    return request_ids


def profile(llm: LLM, batch_size: int, context_len: int, num_steps: int, gbps: float,
            structured_output: StructuredOutput | None = None) -> dict:
    engine = llm.engine
    start_decode_batch(engine, batch_size, context_len, num_steps + 4, f"b{batch_size}", structured_output)
    model, plan = engine.runner.model, engine.runner.decode_plan
    timer = PartTimer(engine.device)
    linears = {type(m) for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear, BlockLinear, Int8Linear))}
    parts = [(engine, "step", "step"), (engine.runner, "run", "runner"), (model, "compute_logits", "LM head")]
    if plan is None:
        parts += [(model, "forward", "forward"), (kernels, "decode_attention", "decode attention"),
                  (kernels, "store_kv", "KV writes"), *((linear, "forward", "linear") for linear in linears)]
    else:  # the plan calls its kernels directly: its forward is one part
        parts.append((plan, "forward", "forward"))
    for owner, attribute, part in parts:
        timer.wrap(owner, attribute, part)
    for _ in range(num_steps):
        engine.step()
    timer.undo()
    while engine.has_unfinished_requests():
        engine.step()
    ms = defaultdict(float, {part: 1e3 * value / num_steps for part, value in timer.seconds.items()})
    kv_bytes = batch_size * (context_len + num_steps / 2) * engine.kv_spec.bytes_per_block / engine.config.block_size
    if plan is None:
        ms["linear"] -= ms["LM head"]  # the LM head is a Linear layer too
        forward_ms = {"linear layers": ms["linear"], "decode attention": ms["decode attention"],
                      "KV writes": ms["KV writes"],
                      "other in the forward": ms["forward"] - ms["linear"] - ms["decode attention"] - ms["KV writes"]}
    else:
        forward_ms = {"forward (decode plan)": ms["forward"]}
    parts_ms = {**forward_ms, "LM head (sampling rows)": ms["LM head"],
                "sampling and input preparation": ms["runner"] - ms["forward"] - ms["LM head"],
                "step bookkeeping": ms["step"] - ms["runner"]}
    return {"batch_size": batch_size, "step_ms": ms["step"], "parts_ms": parts_ms,
            "weight_mb": _weight_bytes(model) / 1e6, "kv_mb": kv_bytes / 1e6,
            "roofline_ms": 1e3 * (_weight_bytes(model) + kv_bytes) / (gbps * 1e9)}


def _weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a step reads: every parameter, each packed Linear weight, each block weight and int8
    weight (the
    LM head included, even where it shares the embedding's values; the embedding itself is read a
    row per token)."""
    embedding = getattr(model.model.embed_tokens, "weight", None)  # None: kept in blocks, which the head counts
    packed = [module for module in model.modules() if isinstance(module, PackedLinear)]
    total = sum(m.in_features * m.out_features for m in packed) * model.dtype.itemsize
    total += sum(m.blocks.numel() for m in model.modules() if isinstance(m, BlockLinear))
    total += sum(m.levels.numel() + 4 * m.scales.numel() for m in model.modules() if isinstance(m, Int8Linear))
    total += sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
    if isinstance(model.lm_head, torch.nn.Linear):  # a tied LM head reads the embedding once
        total += embedding.numel() * embedding.element_size() * model.config.tie_word_embeddings
    return total


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="what `pdserve up --model` takes (default: SmolLM2)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--batch-sizes", default="1,8,16")
    parser.add_argument("--context-len", type=int, default=400)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--quantized-weights", default="dequantized", choices=QUANTIZED_WEIGHTS,
                        help="a GGUF's block weights multiplied as stored, or dequantized at load")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, help="the engine's --quantization (default: none)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="the KV pool's")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="every step through the modules, each part of the forward timed (default: decode "
                             "plans where they serve, the forward timed whole)")
    parser.add_argument("--structured-output", default="none", choices=STRUCTURED_OUTPUTS,
                        help="json: every sequence answers under a JSON schema (its token masks timed)")


def run(args: argparse.Namespace) -> int:
    from pdserve.checkpoints.model_ref import resolve_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model, os.environ).model_dir
    llm = LLM(str(model_dir), dtype=args.dtype, device=args.device, kv_cache_memory_bytes=2 << 30,
              enable_prefix_caching=False, quantized_weights=args.quantized_weights, quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.enforce_eager)
    gbps = read_gbps(llm.engine.device)
    print(f"{model_dir.name}, {args.dtype} on {args.device}, weights {args.quantized_weights}, "
          f"quantization {args.quantization or 'none'}, "
          f"KV {args.kv_cache_dtype}, structured output {args.structured_output}, "
          f"{'eager' if llm.engine.runner.decode_plan is None else 'decode plan'}, {torch.get_num_threads()} thread(s), "
          f"context {args.context_len}, read bandwidth {gbps:.1f} GB/s")
    for batch_size in map(int, args.batch_sizes.split(",")):
        structured_output = STRUCTURED_OUTPUTS[args.structured_output]
        result = profile(llm, batch_size, args.context_len, args.steps, gbps, structured_output)
        print(f"batch {batch_size}: step {result['step_ms']:.1f} ms; roofline {result['roofline_ms']:.1f} ms "
              f"(weights {result['weight_mb']:.0f} MB + KV {result['kv_mb']:.0f} MB), "
              f"{result['step_ms'] / result['roofline_ms']:.2f}x of it")
        for part, value_ms in result["parts_ms"].items():
            print(f"  {part:<34} {value_ms:6.1f} ms  {100 * value_ms / result['step_ms']:5.1f} %")
    return 0
