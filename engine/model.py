"""One decoder for every family (engine/families.py) over a paged KV pool.

Tokens of all scheduled sequences are flattened into one batch: `input_ids [num_tokens]`,
`positions [num_tokens]`. Each layer writes its new K/V into the pool through the slot mapping,
then attends over the pool (see `AttentionMetadata`). The pool is one tensor
`kv_cache [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`, so layer `i` reads
`kv_cache[i, 0]` (K) and `kv_cache[i, 1]` (V), each `[num_blocks, block_size, num_kv_heads, head_dim]`.

Families differ only in the parts `config.parts` picks: q/k norms, Gemma's (1 + w) norms on both
sides of attention and MLP and its scaled embeddings, sliding-window layers (with their own rope
in Gemma 3), softcaps on attention scores and logits, the MLP's activation, and a mixture of
experts in place of the dense MLP.

Layers hand on the residual stream as a pair (x, residual) whose sum it is, so each residual add
is done by the RMSNorm after it (in one pass with it on CPU: kernels/cpu_layer_ops.py).

q/k/v and gate/up projections are fused into one matmul each, and each MoE layer's experts are
stacked into one tensor per projection; `weights.py` packs the Hugging Face tensors into them.
Parameter names otherwise follow the Hugging Face checkpoint.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from pdserve import kernels
from pdserve.kernels import cpu_layer_ops
from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.config import ModelConfig
from pdserve.engine.rope import RotaryEmbedding, apply_rotary

ACTIVATIONS = {"silu": nn.functional.silu, "gelu_tanh": partial(nn.functional.gelu, approximate="tanh")}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rope on x [num_tokens, num_heads, head_dim]: in place by the compiled CPU op where it serves,
    else out of place (engine/rope.py)."""
    rotated = cpu_layer_ops.rotary_(x, cos, sin)
    return apply_rotary(x, cos, sin) if rotated is None else rotated


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, adds_one: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.adds_one = adds_one

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """rms_norm(x); given the residual stream, (rms_norm(residual + x), residual + x), the sum
        written into residual where the compiled op serves."""
        if residual is None:
            return self._normalize(x)
        compiled = cpu_layer_ops.add_rms_norm(x, residual, self.weight, self.eps, self.adds_one)
        if compiled is not None:
            return compiled, residual
        residual = residual + x
        return self._normalize(residual), residual

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        compiled = cpu_layer_ops.rms_norm(x, self.weight, self.eps, self.adds_one)
        if compiled is not None:
            return compiled
        # Normalised in fp32 (one fused op), then as Hugging Face does it: Llama rounds back and
        # scales by w; Gemma scales by (1 + w) in fp32 and rounds last.
        normalized = nn.functional.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        if self.adds_one:
            return (normalized * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * normalized.to(x.dtype)


def make_norm(config: ModelConfig, size: int | None = None) -> RMSNorm:
    return RMSNorm(size or config.hidden_size, config.rms_norm_eps, config.parts.norm_adds_one)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, max_model_len: int):
        super().__init__()
        parts = config.parts
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = (parts.query_pre_attn_scalar or config.head_dim) ** -0.5
        window = parts.sliding_window if layer in parts.sliding_layers else None
        # A window that spans the whole served context masks nothing: left off, the fast kernels serve.
        self.sliding_window = window if window is not None and window < max_model_len else None
        self.logit_softcap = parts.attn_logit_softcap
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = make_norm(config, config.head_dim) if parts.qk_norm else None
        self.k_norm = make_norm(config, config.head_dim) if parts.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        # x: [num_tokens, hidden]; kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # each head normalised over head_dim, before rope
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        kernels.store_kv(k, v, k_cache, v_cache, attn.slot_mapping)

        out = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        masking = dict(sliding_window=self.sliding_window, logit_softcap=self.logit_softcap)
        num_decode = attn.num_decode_tokens
        if num_decode:
            out[:num_decode] = kernels.decode_attention(
                q[:num_decode], k_cache, v_cache, attn.decode_block_tables, attn.decode_context_lens, self.scale,
                **masking)
        if num_decode < num_tokens:
            out[num_decode:] = kernels.prefill_attention(
                q[num_decode:], k_cache, v_cache, attn.prefill_block_tables, attn.prefill_query_start_loc,
                attn.prefill_context_lens, self.scale, **masking)
        return self.o_proj(out.view(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation = ACTIVATIONS[config.parts.activation]
        self.is_silu = config.parts.activation == "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.is_silu and (fused := cpu_layer_ops.silu_and_mul(gate_up)) is not None:
            return self.down_proj(fused)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(self.activation(gate) * up)


class SparseMoE(nn.Module):
    """Each token's output is its top-k experts' outputs weighted by the router's softmax over all
    experts (those k weights renormalised to sum to 1 where the config says so)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        moe = config.parts.moe
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.renormalize
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, config.hidden_size, moe.intermediate_size,
                               ACTIVATIONS[config.parts.activation])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden]
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [num_tokens, num_experts]
        weights, expert_ids = probs.topk(self.top_k, dim=-1)  # [num_tokens, top_k]
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(x, expert_ids, weights.to(x.dtype))


class Experts(nn.Module):
    """Stacked gated MLPs, run grouped: the (token, expert) assignments are sorted by expert, so
    each expert multiplies one contiguous block of the tokens routed to it, once per projection.

    The group sizes are read back to the host once per layer (a sync on CUDA); a grouped-GEMM
    kernel that takes the sizes on the device would remove it.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.activation = activation

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden]; expert_ids, weights: [num_tokens, top_k]
        top_k = expert_ids.shape[1]
        order = expert_ids.flatten().argsort(stable=True)  # [num_tokens * top_k] assignments by expert
        tokens = order // top_k  # [num_tokens * top_k] the token of each assignment
        group_sizes = torch.bincount(expert_ids.flatten(), minlength=self.num_experts).tolist()
        outputs = []
        for expert, rows in enumerate(x[tokens].split(group_sizes)):  # rows: [group_size, hidden]
            if len(rows):
                gate, up = (rows @ self.gate_up_proj[expert].T).chunk(2, dim=-1)  # [group_size, intermediate]
                outputs.append((self.activation(gate) * up) @ self.down_proj[expert].T)
        weighted = torch.cat(outputs) * weights.flatten()[order, None]  # [num_tokens * top_k, hidden]
        return torch.zeros_like(x).index_add_(0, tokens, weighted)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, max_model_len: int):
        super().__init__()
        moe = config.parts.moe
        post_norms = config.parts.post_norms
        self.input_layernorm = make_norm(config)
        self.self_attn = Attention(config, layer, max_model_len)
        self.post_attention_layernorm = make_norm(config)
        self.pre_feedforward_layernorm = make_norm(config) if post_norms else None
        self.post_feedforward_layernorm = make_norm(config) if post_norms else None
        self.mlp = SparseMoE(config) if moe is not None and layer in moe.layers else MLP(config)

    def forward(self, x, residual, cos, sin, kv_cache, attn):
        """The layer's input is x + residual (residual None in the first layer: x alone); returns its
        output the same way, as (x, residual), so that each residual add is done by the norm after it."""
        x, residual = (self.input_layernorm(x), x) if residual is None else self.input_layernorm(x, residual)
        x = self.self_attn(x, cos, sin, kv_cache, attn)
        if self.pre_feedforward_layernorm is None:  # Llama: post_attention_layernorm is the MLP's input norm
            x, residual = self.post_attention_layernorm(x, residual)
            return self.mlp(x), residual
        x, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(x), residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_model_len: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, layer, max_model_len) for layer in range(config.num_layers))
        self.norm = make_norm(config)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device, max_model_len: int | None = None):
        """`max_model_len` (default: the config's max positions) picks LongRoPE's factors
        (engine/rope.py) and drops sliding windows that span it."""
        super().__init__()
        self.config = config
        max_model_len = max_model_len or config.max_position_embeddings
        local_rope = config.parts.local_rope
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_model_len, device)
        self.local_rotary = None if local_rope is None else RotaryEmbedding(
            local_rope, config.head_dim, max_model_len, device)
        self.model = DecoderModel(config, max_model_len)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionMetadata, on_layer_done: Callable[[int], None] | None = None) -> torch.Tensor:
        """`on_layer_done(i)` is called once layer i has written its K/V (so it can be shipped
        while later layers compute). Returns hidden states [num_tokens, hidden]."""
        # input_ids, positions: [num_tokens]
        parts = self.config.parts
        x = self.model.embed_tokens(input_ids)  # [num_tokens, hidden]
        if parts.scale_embeddings:  # by sqrt(hidden) rounded to the dtype, as Hugging Face rounds it
            x = x * torch.tensor(self.config.hidden_size ** 0.5).to(x.dtype)
        rope = self.rotary(positions, x.dtype)  # cos, sin: [num_tokens, 1, rotary_dim] each
        local_rope = rope if self.local_rotary is None else self.local_rotary(positions, x.dtype)
        residual = None
        for i, layer in enumerate(self.model.layers):
            cos, sin = local_rope if i in parts.sliding_layers else rope
            x, residual = layer(x, residual, cos, sin, kv_cache[i], attn)
            if on_layer_done is not None:
                on_layer_done(i)
        return self.model.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()  # [num_rows, vocab_size]
        cap = self.config.parts.final_logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)
