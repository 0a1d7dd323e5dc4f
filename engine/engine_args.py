"""The engine's command-line flags (`pdserve prefill|decode|serve`), the `EngineConfig` built from
them, and the process set-up an engine needs before its threads start (CPU pinning), as vLLM's
`EngineArgs` gathers them.
"""
from __future__ import annotations

import argparse
import os

import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.cpu_features import cpu_has_hardware_bf16
from pdserve.engine.engine_config import (DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, QUANTIZED_WEIGHTS, EngineConfig,
                                         memory_size_arg, resolve_dtype)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's flags (the model itself is cluster.service_args.add_model_argument)."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto: on a CPU, bfloat16 where it has AVX512-BF16 or AMX, else float32; on a GPU, "
                             "the checkpoint's dtype (bfloat16 for a float32 checkpoint). Prefill and decode "
                             "replicas must agree: give it on hosts whose CPUs differ")
    parser.add_argument("--quantized-weights", default="dequantized", choices=QUANTIZED_WEIGHTS,
                        help="dequantized: every weight is widened to --dtype at load; as-stored: the "
                             "matrices a .gguf holds in Q8_0, Q4_0 or Q4_1 blocks are multiplied as stored (under "
                             "half the memory; on a CPU, faster decode steps of a few sequences, slower ones of "
                             "many); as-stored-int8-activations: as stored, and on a CPU a decode step's "
                             "activations quantized to int8 per 32 for the Q4 matrices, as llama.cpp does; "
                             "as-stored-int8-prefill: a prefill's too, where faster (AVX512-VNNI without AMX)")
    parser.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                        help="quantize the Linear layers' weights at load: int8 (Q8_0) or int4 (Q4_1; the head "
                             "Q8_0), in groups of 32, activations in --dtype; or w8a8: q/k/v and gate/up as int8 "
                             "weights per output row times int8 activations per token, smoothed at load, the rest "
                             "in --dtype (default: none); with --quantized-weights as-stored, the layers a .gguf "
                             "holds in blocks keep them")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="auto: the KV pool in --dtype; int8: each token's K and V per kv head as int8 levels "
                             "and a float32 scale (about half of bfloat16's bytes). Prefill and decode replicas "
                             "must agree")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-memory", type=memory_size_arg, default=None, metavar="SIZE",
                        help="the KV pool's size, e.g. 4GiB, 512MiB or a number of bytes (default on a CPU: half of "
                             "the memory available once the weights are loaded, for a decode replica no more than "
                             "/dev/shm has room for; on CUDA see --gpu-memory-utilization)")
    parser.add_argument("--num-gpu-blocks", type=int, default=None, help="KV pool size in blocks")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="on CUDA: the share of the GPU's memory this replica may take, weights, activations "
                             "and KV pool (sized by a profile run) together, unless --kv-cache-memory or "
                             "--num-gpu-blocks is given (default 0.9)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the KV of full blocks of prompts seen before")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="run every step through the model's modules; by default a CPU runs decode steps as "
                             "a plan of compiled calls bound once, with the same results")
    parser.add_argument("--cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="pin to these CPUs (e.g. 0-3,6) and run as many torch threads")


def parse_cpu_list(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def bind_cpus(cpus: list[int] | None) -> None:
    """Pins this process to `cpus` and sizes torch's thread pool to them; call before any thread
    starts, so that every later one (the engine's, gRPC's, OpenMP's) inherits the pinning."""
    if not cpus:
        return
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))


def engine_config_from(args: argparse.Namespace, detokenize: bool) -> EngineConfig:
    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks, kv_cache_memory_bytes=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        detokenize=detokenize, enable_prefix_caching=args.enable_prefix_caching,
        quantized_weights=args.quantized_weights, quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        enforce_eager=args.enforce_eager)


def model_text(args: argparse.Namespace, served_name: str) -> str:
    """"<served id> (<dtype> on <device>)", the dtype as the engine resolves `--dtype auto`, and
    ", int8 weights" and ", int8 KV" within the brackets under --quantization int8 and
    --kv-cache-dtype int8: how the startup lines (cluster.startup_log) name the engine `args` configure."""
    checkpoint_dtype = ModelConfig.from_dir(args.model).torch_dtype
    dtype = resolve_dtype(args.dtype, checkpoint_dtype, args.device, cpu_has_hardware_bf16())
    quantization = "" if args.quantization is None else f", {args.quantization} weights"
    kv = "" if args.kv_cache_dtype == "auto" else f", {args.kv_cache_dtype} KV"
    return f"{served_name} ({dtype} on {args.device}{quantization}{kv})"
