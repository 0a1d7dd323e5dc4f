"""A decode step's forward on CPU as one flat list of calls, bound once per batch size: the CPU's
counterpart of a captured CUDA graph.

Through the modules, a decode step of a few sequences spends about as long in Python as in its
kernels: 30 layers x 11 ops, each a module call, the dispatch checks of `kernels`, a fresh output
tensor and a `ctypes` call. A plan binds each op once, to buffers that every step reuses: the
compiled layer ops, KV writes, decode attention and Q4 int8-activation products become `ctypes`
calls with their pointers and sizes fixed; any other linear layer is the module's own call,
copied into its buffer. A step copies its inputs (the embedded tokens, rope's cos and sin, slots,
block tables, context lengths) into the plan's buffers and runs the calls in order. (SmolLM2-135M's
Q4_1 file, bfloat16, one sequence of 300 tokens, two threads of an AMD EPYC: with int8
activations a step takes 3.8 ms planned against 6.8 through the modules; with its weights
dequantized 10.3 against 12.6; 16 sequences with int8 activations 19.7 against 23.6.)

Invariant: a plan computes what `CausalLM.forward` computes for the same decode-only batch, bit
for bit: the same kernels, on the same arguments, in the same order. `DecodePlans.serves` says
which models and pools a plan can run (Llama's layer: no q/k norms, no norms after attention and
the MLP, a dense SwiGLU MLP, biases or not; a float pool of the model's dtype or an int8 one);
everything else, prefills and mixed steps included, runs through the modules.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.block_linear import MAX_PACKED_KERNEL_ROWS, BlockLinear
from pdserve.engine.model import MLP, CausalLM, DecoderLayer
from pdserve.kernels import cpu_decode_attention, cpu_layer_ops, cpu_packed_q4_linear, cpu_store_kv_int8
from pdserve.kernels.block_quant_reference import BLOCK_TYPES

Call = Callable[[], int | None]  # 0 or None once done, else a kernel's error status


class DecodePlans:
    """Plans of one model over one pool, one per batch size and thread count, bound on first use;
    their buffers, sized for `max_num_seqs` rows, are shared (a plan of B rows uses the first B)."""

    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, max_num_seqs: int, max_blocks_per_seq: int):
        config, dtype = model.config, model.dtype
        self.model, self.kv_cache = model, kv_cache
        self._plans: dict[tuple[int, int], list[tuple[str, Call]]] = {}
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        rotary_dims = [rotary.inv_freq.numel() * 2 for rotary in (model.rotary, model.local_rotary or model.rotary)]

        def rows(width: int, row_dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros(max_num_seqs, width, dtype=row_dtype)

        # the residual stream; a norm's output; attention's or the MLP's output; the final norm's
        self.residual, self.normed, self.layer_out, self.hidden = (rows(config.hidden_size) for _ in range(4))
        self.qkv, self.attn_out = rows(q_size + 2 * kv_size), rows(q_size)
        self.gate_up, self.act = rows(2 * config.intermediate_size), rows(config.intermediate_size)
        self.cos, self.sin = rows(rotary_dims[0]), rows(rotary_dims[0])
        self.local_cos, self.local_sin = rows(rotary_dims[1]), rows(rotary_dims[1])
        self.block_tables = rows(max_blocks_per_seq, torch.int32)
        self.context_lens = torch.ones(max_num_seqs, dtype=torch.int32)
        self.slots = torch.zeros(max_num_seqs, dtype=torch.int64)

    @staticmethod
    def serves(model: CausalLM, kv_cache: torch.Tensor) -> bool:
        """Whether a plan can run `model`'s decode steps over `kv_cache` (see the module's doc)."""
        parts, dtype = model.config.parts, model.dtype
        return (kv_cache.device.type == "cpu" and kv_cache.is_contiguous() and dtype in (torch.float32, torch.bfloat16)
                and kv_cache.dtype in (dtype, torch.int8) and parts.activation == "silu"
                and all(type(layer.mlp) is MLP and layer.self_attn.q_norm is None
                        and layer.pre_feedforward_layernorm is None for layer in model.model.layers)
                and cpu_layer_ops.load(dtype) is not None and cpu_decode_attention.load(kv_cache.dtype) is not None
                and (kv_cache.dtype != torch.int8 or cpu_store_kv_int8.load(dtype) is not None))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """`CausalLM.forward` of a decode-only batch (attn.num_decode_tokens == len(input_ids)):
        hidden states [num_seqs, hidden], a view into the plans' buffer, valid until the next step."""
        num_seqs = input_ids.shape[0]
        x, rope, local_rope = self.model.embed(input_ids, positions)
        self.residual[:num_seqs].copy_(x)
        for (cos, sin), (cos_buffer, sin_buffer) in ((rope, (self.cos, self.sin)),
                                                     (local_rope, (self.local_cos, self.local_sin))):
            cos_buffer[:num_seqs].copy_(cos.view(num_seqs, -1))
            sin_buffer[:num_seqs].copy_(sin.view(num_seqs, -1))
        self.block_tables[:num_seqs, :attn.decode_block_tables.shape[1]].copy_(attn.decode_block_tables)
        self.context_lens[:num_seqs].copy_(attn.decode_context_lens)
        self.slots[:num_seqs].copy_(attn.slot_mapping)
        for name, call in self._plan(num_seqs):
            status = call()
            if status:
                raise RuntimeError(f"decode plan: {name} failed with status {status}")
        return self.hidden[:num_seqs]

    def _plan(self, num_seqs: int) -> list[tuple[str, Call]]:
        key = (num_seqs, torch.get_num_threads())
        if key not in self._plans:
            self._plans[key] = self._bind(num_seqs, key[1])
        return self._plans[key]

    def _bind(self, num_seqs: int, num_threads: int) -> list[tuple[str, Call]]:
        """Each layer: its input norm (the first over the embedding, the residual stream's start;
        each later one after adding the last MLP's output to it), attention, the norm that adds
        attention's output, the MLP; then the final norm, adding the last MLP's."""
        decoder = self.model.model
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        first_norm = decoder.layers[0].input_layernorm
        calls = [("rms_norm", _bound(layer_ops.rms_norm, self.normed.data_ptr(), self.residual.data_ptr(),
                                     first_norm.weight.data_ptr(), num_seqs, self.residual.shape[1], first_norm.eps,
                                     first_norm.adds_one))]
        for i, layer in enumerate(decoder.layers):
            if i > 0:
                calls.append(self._add_rms_norm(layer.input_layernorm, num_seqs))
            calls += self._attention(layer, i, num_seqs, num_threads)
            calls.append(self._add_rms_norm(layer.post_attention_layernorm, num_seqs))
            calls += self._mlp(layer.mlp, num_seqs, num_threads)
        calls.append(self._add_rms_norm(decoder.norm, num_seqs, out=self.hidden))
        return calls

    def _add_rms_norm(self, norm: torch.nn.Module, num_seqs: int, out: torch.Tensor | None = None
                      ) -> tuple[str, Call]:
        """residual += the attention's or MLP's output; out (default: the normed buffer) = norm(residual)."""
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        return ("add_rms_norm", _bound(layer_ops.add_rms_norm, (self.normed if out is None else out).data_ptr(),
                                       self.residual.data_ptr(), self.layer_out.data_ptr(), norm.weight.data_ptr(),
                                       num_seqs, self.residual.shape[1], norm.eps, norm.adds_one))

    def _attention(self, layer: DecoderLayer, index: int, num_seqs: int, num_threads: int) -> list[tuple[str, Call]]:
        attention, config = layer.self_attn, self.model.config
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        num_heads, num_kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        qkv, width, itemsize = self.qkv.data_ptr(), self.qkv.shape[1], self.qkv.element_size()
        q, k, v = qkv, qkv + attention.q_size * itemsize, qkv + (attention.q_size + attention.kv_size) * itemsize
        local = index in config.parts.sliding_layers
        cos, sin = (self.local_cos, self.local_sin) if local else (self.cos, self.sin)
        rope = [(q, num_heads), (k, num_kv_heads)]
        k_cache, v_cache = self.kv_cache[index, 0], self.kv_cache[index, 1]  # [num_blocks, block_size, kv_heads, entry]
        num_blocks, block_size = k_cache.shape[:2]
        kv_args = (k_cache.data_ptr(), v_cache.data_ptr(), k, v, self.slots.data_ptr(), num_seqs)
        if self.kv_cache.dtype == torch.int8:
            store = _bound(cpu_store_kv_int8.load(self.model.dtype).store_kv_int8, *kv_args, num_kv_heads, head_dim,
                           width, width)
        else:
            num_slots = num_blocks * block_size
            store = _bound(layer_ops.store_kv, *kv_args, num_kv_heads * head_dim, width, width, num_slots)
        decode = cpu_decode_attention.load(self.kv_cache.dtype).paged_decode_attention
        return [
            self._linear("qkv_proj", attention.qkv_proj, self.normed, self.qkv, num_seqs, num_threads),
            *(("rotary", _bound(layer_ops.rotary, x, cos.data_ptr(), sin.data_ptr(), num_seqs, width, heads, head_dim,
                                cos.shape[1])) for x, heads in rope),
            ("store_kv", store),
            ("decode_attention", _bound(
                decode, self.attn_out.data_ptr(), q, k_cache.data_ptr(), v_cache.data_ptr(), self.block_tables.data_ptr(),
                self.context_lens.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size,
                self.block_tables.shape[1], attention.scale, attention.sliding_window or 0,
                attention.logit_softcap or 0.0, width, self.model.dtype == torch.bfloat16, num_threads)),
            self._linear("o_proj", attention.o_proj, self.attn_out, self.layer_out, num_seqs, num_threads),
        ]

    def _mlp(self, mlp: MLP, num_seqs: int, num_threads: int) -> list[tuple[str, Call]]:
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        return [
            self._linear("gate_up_proj", mlp.gate_up_proj, self.normed, self.gate_up, num_seqs, num_threads),
            ("silu_and_mul", _bound(layer_ops.silu_and_mul, self.act.data_ptr(), self.gate_up.data_ptr(), num_seqs,
                                    self.act.shape[1])),
            self._linear("down_proj", mlp.down_proj, self.act, self.layer_out, num_seqs, num_threads),
        ]

    def _linear(self, name: str, linear: torch.nn.Module, x: torch.Tensor, out: torch.Tensor, num_seqs: int,
                num_threads: int) -> tuple[str, Call]:
        """out[:num_seqs] = linear(x[:num_seqs]): a Q4 weight packed for int8 activations as its
        kernel's call, any other layer as the module's call into the buffer."""
        if (isinstance(linear, BlockLinear) and linear.packed and linear.bias is None
                and num_seqs <= MAX_PACKED_KERNEL_ROWS):
            library = cpu_packed_q4_linear.load()
            return name, _bound(library.packed_q4_linear, out.data_ptr(), x.data_ptr(), linear.blocks.data_ptr(),
                                BLOCK_TYPES[linear.block_type].ggml_type, num_seqs, linear.out_features,
                                linear.in_features, x.dtype == torch.bfloat16, num_threads)
        x_rows, out_rows = x[:num_seqs], out[:num_seqs]

        def call() -> None:
            out_rows.copy_(linear(x_rows))

        return name, call


def _bound(function: ctypes._CFuncPtr, *args) -> Call:
    """`function` with `args` converted once to its argument types."""
    converted = [arg_type(arg) for arg_type, arg in zip(function.argtypes, args, strict=True)]
    return lambda: function(*converted)
