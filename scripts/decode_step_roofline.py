"""One decode step of an 8B-shaped Llama (random weights, bf16) against its weight+KV roofline.

A decode step reads every weight once and, in attention, every context token's K and V, so its
floor is `(weight bytes + batch * context * KV bytes per token) / memory bandwidth`, the
bandwidth being this device's measured copy bandwidth (decode_bandwidth.copy_gbps). The script
times steps of each `--batch-sizes` at `--context-len` (CUDA events) and prints the time, the
floor and the fraction of it reached. `--tiny --device cpu` runs the same code on a small shape
to check the script itself where no GPU is at hand.
"""
import argparse

import torch
from decode_bandwidth import copy_gbps, seconds_per_call

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.config import ModelConfig, RopeConfig
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.engine.model import CausalLM

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                num_kv_heads=8, head_dim=128)
TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=8,
            num_kv_heads=4, head_dim=32)
BLOCK_SIZE = 16


def model_config(shape: dict) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", max_position_embeddings=131072, rms_norm_eps=1e-5,
                       rope=RopeConfig(theta=500000.0), qkv_bias=False, o_bias=False, mlp_bias=False,
                       tie_word_embeddings=False, bos_token_id=None, eos_token_ids=(), torch_dtype="bfloat16",
                       **shape)


def decode_step_seconds(config: ModelConfig, batch_size: int, context_len: int, device: torch.device,
                        num_iters: int) -> tuple[float, int, int]:
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = CausalLM(config, device).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks_per_seq = -(-(context_len + 1) // BLOCK_SIZE)
    spec = KVCacheSpec.for_model(config, BLOCK_SIZE, torch.bfloat16)
    kv_cache = spec.allocate(batch_size * blocks_per_seq, device).normal_()
    block_tables = torch.arange(batch_size * blocks_per_seq, dtype=torch.int32, device=device).view(batch_size, -1)
    positions = torch.full((batch_size,), context_len, dtype=torch.int64, device=device)
    slots = block_tables[:, context_len // BLOCK_SIZE].long() * BLOCK_SIZE + context_len % BLOCK_SIZE
    attn = AttentionMetadata(
        slot_mapping=slots, num_decode_tokens=batch_size, decode_block_tables=block_tables,
        decode_context_lens=torch.full((batch_size,), context_len + 1, dtype=torch.int32, device=device),
        prefill_block_tables=torch.empty(0, blocks_per_seq, dtype=torch.int32, device=device),
        prefill_query_start_loc=torch.zeros(1, dtype=torch.int32, device=device),
        prefill_context_lens=torch.empty(0, dtype=torch.int32, device=device))
    input_ids = torch.randint(0, config.vocab_size, (batch_size,), device=device)
    kv_bytes = batch_size * (context_len + 1) * spec.bytes_per_block // BLOCK_SIZE

    def step() -> None:
        with torch.inference_mode():
            model.compute_logits(model(input_ids, positions, kv_cache, attn))

    return seconds_per_call(step, num_iters, device), weight_bytes, kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small shape, to check the script on CPU")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--context-len", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--copy-mib", type=int, default=4096, help="buffer the copy bandwidth is measured on")
    args = parser.parse_args()
    config = model_config(TINY if args.tiny else LLAMA_8B)
    device = torch.device(args.device)
    bandwidth_gbps = copy_gbps(args.copy_mib * 2**20, args.iters, device)
    print(f"{config.num_layers}-layer decode step on {device}; measured copy bandwidth {bandwidth_gbps:.0f} GB/s")
    for batch_size in args.batch_sizes:
        seconds, weight_bytes, kv_bytes = decode_step_seconds(config, batch_size, args.context_len, device, args.iters)
        floor_s = (weight_bytes + kv_bytes) / (bandwidth_gbps * 1e9)
        print(f"batch {batch_size:>3}, context {args.context_len}: step {seconds * 1e3:8.2f} ms; "
              f"weights {weight_bytes / 2**30:.2f} GiB + KV {kv_bytes / 2**30:.2f} GiB -> roofline "
              f"{floor_s * 1e3:.2f} ms ({floor_s / seconds:.0%} of it reached)")
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
