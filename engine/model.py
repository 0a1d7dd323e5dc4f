"""One decoder for every family (engine/families.py) over a paged KV pool.

Tokens of all scheduled sequences are flattened into one batch: `input_ids [num_tokens]`,
`positions [num_tokens]`. Each layer writes its new K/V into the pool through the slot mapping,
then attends over the pool (see `AttentionMetadata`). The pool is one tensor
`kv_cache [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`, so layer `i` reads
`kv_cache[i, 0]` (K) and `kv_cache[i, 1]` (V), each `[num_blocks, block_size, num_kv_heads, head_dim]`.

Families differ only in the parts `config.parts` picks: q/k norms, (1 + w) norms, norms after
attention and the MLP too, scaled embeddings, sliding-window layers (each kind with its own rope
where the config gives two), softcaps on attention scores and logits, SwiGLU or GeGLU, and a
mixture of experts (engine/moe.py) in place of the dense MLP. Every op goes through `kernels`,
which picks what serves the tensors; nothing here branches on a device.

Layers hand on the residual stream as a pair (x, residual) whose sum it is, so each residual add
is done by the RMSNorm after it (`kernels.add_rms_norm`, one pass on CPU).

q/k/v and gate/up projections are fused into one matmul each. Checkpoints that keep them apart
are fused on load, by a load hook on the layer that splits them (`fuse_on_load`); a family whose
checkpoint stores them fused (`config.checkpoint.fused`) loads them as they are. Parameter names
otherwise follow the Hugging Face checkpoint, after the family's renames (engine/weights.py).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pdserve import kernels
from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.config import ModelConfig
from pdserve.engine.moe import SparseMoE
from pdserve.engine.rope import RotaryEmbedding

GATED_ACTIVATIONS = {"silu": kernels.silu_and_mul, "gelu_tanh": kernels.gelu_tanh_and_mul}  # SwiGLU, GeGLU


def fuse_on_load(module: nn.Module, fused: str, parts: tuple[str, ...]) -> None:
    """The checkpoint's `parts` (weights [rows_i, in], biases [rows_i]) load as `fused`, their rows
    stacked in that order: the order in which `module`'s forward splits the fused output. The
    parts are kept in `module.checkpoint_parts`, for readers of the checkpoint's other files."""
    module.checkpoint_parts = {**getattr(module, "checkpoint_parts", {}), fused: parts}

    def hook(module, state_dict, prefix, *args) -> None:
        for suffix in ("weight", "bias"):
            names = [f"{prefix}{part}.{suffix}" for part in parts]
            if all(name in state_dict for name in names):
                state_dict[f"{prefix}{fused}.{suffix}"] = stack_rows([state_dict.pop(name) for name in names])

    module.register_load_state_dict_pre_hook(hook)


def stack_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(tensors); of meta tensors (weights served as stored, never read:
    engine/weights.py) a meta tensor made directly, since torch.cat's meta kernel imports torch's
    symbolic shapes (sympy: about a second and 90 MiB)."""
    if tensors[0].is_meta:
        rows = sum(tensor.shape[0] for tensor in tensors)
        return torch.empty((rows, *tensors[0].shape[1:]), dtype=tensors[0].dtype, device="meta")
    return torch.cat(tensors)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, adds_one: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.adds_one = adds_one

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """rms_norm(x); given the residual stream, (rms_norm(residual + x), residual + x), the sum
        possibly written into residual."""
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps, self.adds_one)
        return kernels.add_rms_norm(x, residual, self.weight, self.eps, self.adds_one)


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
        if not config.checkpoint.fused:
            fuse_on_load(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"))

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
        q, k = kernels.apply_rope(q, cos, sin), kernels.apply_rope(k, cos, sin)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        kernels.store_kv(k, v, k_cache, v_cache, attn.slot_mapping)

        masking = dict(sliding_window=self.sliding_window, logit_softcap=self.logit_softcap)
        num_decode = attn.num_decode_tokens
        parts = []  # [num_decode, num_heads, head_dim], then [num_tokens - num_decode, ...]
        if num_decode:
            parts.append(kernels.decode_attention(
                q[:num_decode], k_cache, v_cache, attn.decode_block_tables, attn.decode_context_lens, self.scale,
                **masking))
        if num_decode < num_tokens:
            parts.append(kernels.prefill_attention(
                q[num_decode:], k_cache, v_cache, attn.prefill_block_tables, attn.prefill_query_start_loc,
                attn.prefill_context_lens, self.scale, **masking))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)  # [num_tokens, num_heads, head_dim]
        return self.o_proj(out.view(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_and_mul = GATED_ACTIVATIONS[config.parts.activation]
        if not config.checkpoint.fused:
            fuse_on_load(self, "gate_up_proj", ("gate_proj", "up_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, hidden] -> gate_up: [num_tokens, 2 * intermediate]
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


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
        act_and_mul = GATED_ACTIVATIONS[config.parts.activation]
        self.mlp = SparseMoE(config, act_and_mul) if moe is not None and layer in moe.layers else MLP(config)

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
        # Given its table, nn.Embedding skips its random init, whose meta-device form imports
        # torch._dynamo (and Triton): about 140 MiB of a replica's resident memory.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
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
            self.checkpoint_parts = {"lm_head": ("model.embed_tokens",)}
            self._tie_head()
            self.register_load_state_dict_pre_hook(self._head_from_embeddings)
            self.register_load_state_dict_post_hook(lambda module, incompatible_keys: module._tie_head())

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the activations flow in: the embedding lookup's."""
        embeddings = self.model.embed_tokens
        return embeddings.weight.dtype if isinstance(embeddings, nn.Embedding) else embeddings.dtype

    def _tie_head(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def _head_from_embeddings(module, state_dict, prefix, *args) -> None:
        """A tied checkpoint's head is its embeddings, whether or not it stores lm_head.weight."""
        embeddings = state_dict.get(f"{prefix}model.embed_tokens.weight")
        if embeddings is not None:
            state_dict[f"{prefix}lm_head.weight"] = embeddings

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionMetadata, on_layer_done: Callable[[int], None] | None = None) -> torch.Tensor:
        """`on_layer_done(i)` is called once layer i has written its K/V (so it can be shipped
        while later layers compute). Returns hidden states [num_tokens, hidden]."""
        # input_ids, positions: [num_tokens]
        parts = self.config.parts
        x, rope, local_rope = self.embed(input_ids, positions)
        residual = None
        for i, layer in enumerate(self.model.layers):
            cos, sin = local_rope if i in parts.sliding_layers else rope
            x, residual = layer(x, residual, cos, sin, kv_cache[i], attn)
            if on_layer_done is not None:
                on_layer_done(i)
        return self.model.norm(x, residual)[0]

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """The first layer's input x [num_tokens, hidden], and the (cos, sin) of global-attention
        layers and of sliding-window ones, each [num_tokens, 1, rotary_dim]."""
        x = self.model.embed_tokens(input_ids)  # [num_tokens, hidden]
        if self.config.parts.scale_embeddings:  # by sqrt(hidden) rounded to the dtype, as Hugging Face rounds it
            x = x * torch.tensor(self.config.hidden_size ** 0.5).to(x.dtype)
        rope = self.rotary(positions, x.dtype)
        return x, rope, rope if self.local_rotary is None else self.local_rotary(positions, x.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()  # [num_rows, vocab_size]
        cap = self.config.parts.final_logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)
