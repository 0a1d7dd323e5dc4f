"""A decode step's forward on CPU as one flat list of calls, bound once: the CPU's counterpart of a
captured CUDA graph.

Through the modules, a decode step of a few sequences spends about as long in Python as in its
kernels: 30 layers x 11 ops, each a module call, the dispatch checks of `kernels`, a fresh output
tensor and a `ctypes` call. A plan binds each op once, to buffers that every step reuses: the
compiled layer ops, KV writes, decode attention and Q4 int8-activation products become `ctypes`
calls with their arguments converted once, the step's sequence and thread counts among them as
ctypes values each step sets; any other linear layer is the module's own call, copied into its
buffer. A step copies its inputs (the embedded tokens, rope's cos and sin, slots, block tables,
context lengths) into the plan's buffers and runs the calls in order. (SmolLM2-135M's
Q4_1 file, bfloat16, one sequence of 300 tokens, two threads of an AMD EPYC: with int8
activations a step takes 3.8 ms planned against 6.8 through the modules; with its weights
dequantized 10.3 against 12.6; 16 sequences with int8 activations 19.7 against 23.6.)

Invariant: a plan computes what `CausalLM.forward` computes for the same decode-only batch, bit
for bit: the same kernels, on the same arguments, in the same order. `DecodePlan.serves` says
which models and pools a plan can run (Llama's layer: no q/k norms, no norms after attention and
the MLP, a dense SwiGLU MLP, biases or not; a float pool of the model's dtype or an int8 one);
everything else, prefills and mixed steps included, runs through the modules.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.model import MLP, CausalLM, DecoderLayer
from pdserve.kernels import cpu_decode_attention, cpu_layer_ops, cpu_packed_q4_linear, cpu_store_kv_int8
from pdserve.kernels.block_quant_reference import BLOCK_TYPES

Call = Callable[[], int | None]  # 0 or None once done, else a kernel's error status
NUM_SEQS, NUM_THREADS = object(), object()  # bound arguments that each step sets


class DecodePlan:
    """The plan of one model over one pool, bound on first use; its buffers hold `max_num_seqs`
    rows, of which a step of B sequences uses the first B."""

    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, max_num_seqs: int, max_blocks_per_seq: int):
        config, dtype = model.config, model.dtype
        self.model, self.kv_cache = model, kv_cache
        self._calls: list[tuple[str, Call]] = []
        self._step_sizes: dict[tuple[object, type], ctypes._SimpleCData] = {}  # (NUM_SEQS or NUM_THREADS, type)
        self._num_seqs = 0
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
        hidden states [num_seqs, hidden], a view into the plan's buffer, valid until the next step."""
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
        self._calls = self._calls or self._bind()
        self._num_seqs, num_threads = num_seqs, torch.get_num_threads()
        for (size, _), value in self._step_sizes.items():
            value.value = num_seqs if size is NUM_SEQS else num_threads
        for name, call in self._calls:
            status = call()
            if status:
                raise RuntimeError(f"decode plan: {name} failed with status {status}")
        return self.hidden[:num_seqs]

    def _bind(self) -> list[tuple[str, Call]]:
        """Each layer: its input norm (the first over the embedding, the residual stream's start;
        each later one after adding the last MLP's output to it), attention, the norm that adds
        attention's output, the MLP; then the final norm, adding the last MLP's."""
        decoder = self.model.model
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        first_norm = decoder.layers[0].input_layernorm
        calls = [("rms_norm", self._bound(layer_ops.rms_norm, self.normed.data_ptr(), self.residual.data_ptr(),
                                          first_norm.weight.data_ptr(), NUM_SEQS, self.residual.shape[1],
                                          first_norm.eps, first_norm.adds_one))]
        for i, layer in enumerate(decoder.layers):
            if i > 0:
                calls.append(self._add_rms_norm(layer.input_layernorm))
            calls += self._attention(layer, i)
            calls.append(self._add_rms_norm(layer.post_attention_layernorm))
            calls += self._mlp(layer.mlp)
        calls.append(self._add_rms_norm(decoder.norm, out=self.hidden))
        return calls

    def _add_rms_norm(self, norm: torch.nn.Module, out: torch.Tensor | None = None) -> tuple[str, Call]:
        """residual += the attention's or MLP's output; out (default: the normed buffer) = norm(residual)."""
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        return ("add_rms_norm", self._bound(layer_ops.add_rms_norm, (self.normed if out is None else out).data_ptr(),
                                            self.residual.data_ptr(), self.layer_out.data_ptr(),
                                            norm.weight.data_ptr(), NUM_SEQS, self.residual.shape[1], norm.eps,
                                            norm.adds_one))

    def _attention(self, layer: DecoderLayer, index: int) -> list[tuple[str, Call]]:
        attention, config, dtype = layer.self_attn, self.model.config, self.model.dtype
        layer_ops = cpu_layer_ops.load(dtype)
        num_heads, num_kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        qkv, width, itemsize = self.qkv.data_ptr(), self.qkv.shape[1], self.qkv.element_size()
        q, k, v = qkv, qkv + attention.q_size * itemsize, qkv + (attention.q_size + attention.kv_size) * itemsize
        cos, sin = (self.local_cos, self.local_sin) if index in config.parts.sliding_layers else (self.cos, self.sin)
        k_cache, v_cache = self.kv_cache[index, 0], self.kv_cache[index, 1]  # [num_blocks, block_size, kv_heads, entry]
        num_blocks, block_size = k_cache.shape[:2]
        kv_args = (k_cache.data_ptr(), v_cache.data_ptr(), k, v, self.slots.data_ptr(), NUM_SEQS)
        if self.kv_cache.dtype == torch.int8:
            store = self._bound(cpu_store_kv_int8.load(dtype).store_kv_int8, *kv_args, num_kv_heads, head_dim, width,
                                width)
        else:
            store = self._bound(layer_ops.store_kv, *kv_args, num_kv_heads * head_dim, width, width,
                                num_blocks * block_size)
        decode = cpu_decode_attention.load(self.kv_cache.dtype).paged_decode_attention
        return [
            self._linear("qkv_proj", attention.qkv_proj, self.normed, self.qkv),
            *(("rotary", self._bound(layer_ops.rotary, x, cos.data_ptr(), sin.data_ptr(), NUM_SEQS, width, heads,
                                     head_dim, cos.shape[1])) for x, heads in ((q, num_heads), (k, num_kv_heads))),
            ("store_kv", store),
            ("decode_attention", self._bound(
                decode, self.attn_out.data_ptr(), q, k_cache.data_ptr(), v_cache.data_ptr(), self.block_tables.data_ptr(),
                self.context_lens.data_ptr(), NUM_SEQS, num_heads, num_kv_heads, head_dim, num_blocks, block_size,
                self.block_tables.shape[1], attention.scale, attention.sliding_window or 0,
                attention.logit_softcap or 0.0, width, dtype == torch.bfloat16, NUM_THREADS)),
            self._linear("o_proj", attention.o_proj, self.attn_out, self.layer_out),
        ]

    def _mlp(self, mlp: MLP) -> list[tuple[str, Call]]:
        layer_ops = cpu_layer_ops.load(self.model.dtype)
        return [
            self._linear("gate_up_proj", mlp.gate_up_proj, self.normed, self.gate_up),
            ("silu_and_mul", self._bound(layer_ops.silu_and_mul, self.act.data_ptr(), self.gate_up.data_ptr(),
                                         NUM_SEQS, self.act.shape[1])),
            self._linear("down_proj", mlp.down_proj, self.act, self.layer_out),
        ]

    def _linear(self, name: str, linear: torch.nn.Module, x: torch.Tensor, out: torch.Tensor) -> tuple[str, Call]:
        """out[:num_seqs] = linear(x[:num_seqs]): the module's call into the buffer; for a Q4
        weight packed for int8 activations, as the module would choose it, its kernel's call."""
        packed = None
        if isinstance(linear, BlockLinear) and linear.packed and linear.bias is None:
            packed = self._bound(cpu_packed_q4_linear.load().packed_q4_linear, out.data_ptr(), x.data_ptr(),
                                 linear.blocks.data_ptr(), BLOCK_TYPES[linear.block_type].ggml_type, NUM_SEQS,
                                 linear.out_features, linear.in_features, x.dtype == torch.bfloat16, NUM_THREADS)

        def call() -> int | None:
            num_seqs = self._num_seqs
            if packed is not None and num_seqs <= linear.max_kernel_rows:
                return packed()
            out[:num_seqs].copy_(linear(x[:num_seqs]))
            return None

        return name, call

    def _bound(self, function: ctypes._CFuncPtr, *args) -> Call:
        """`function` with `args` converted once to its argument types; NUM_SEQS and NUM_THREADS
        become values that each step sets."""
        converted = [self._step_sizes.setdefault((arg, arg_type), arg_type(0)) if arg is NUM_SEQS or arg is NUM_THREADS
                     else arg_type(arg) for arg_type, arg in zip(function.argtypes, args, strict=True)]
        return lambda: function(*converted)
