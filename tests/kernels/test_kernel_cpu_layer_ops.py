"""The compiled CPU layer ops equal their torch references (kernels/layer_ops_reference.py):
RMSNorm (Llama's and Gemma's rounding), alone and after the residual add, rope over full and
partial rotary dims, in place on a view into a fused projection, SiLU-and-multiply over widths
the vectors do and do not divide, and K/V writes from a fused projection, in float32 and bfloat16 (bit for bit there but at rounding edges,
both rounding after every op); what they cannot serve, `kernels` hands to the references."""
import pytest
import torch

from pdserve import kernels
from pdserve.kernels import cpu_layer_ops
from pdserve.kernels.layer_ops_reference import rms_norm_reference as torch_rms_norm
from pdserve.kernels.layer_ops_reference import rope_reference
from pdserve.kernels.reference import store_kv_reference

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_layer_ops.load.cache_clear()
    if cpu_layer_ops.load(torch.float32) is None:
        pytest.skip("no C compiler: the compiled CPU ops are unavailable")
    yield
    cpu_layer_ops.load.cache_clear()


def assert_equal_for(dtype, out, expected):
    if dtype == torch.bfloat16:
        # The same roundings; the float32 sum of squares may differ in its last bit and move one
        # element across a bfloat16 rounding edge.
        assert (out != expected).float().mean() < 0.01
        torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    else:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("adds_one", [False, True])
@pytest.mark.parametrize("num_rows", [1, 37])
def test_rms_norm_equals_torch(dtype, adds_one, num_rows):
    torch.manual_seed(num_rows)
    x = (torch.randn(num_rows, 96) * 3).to(dtype)
    weight = torch.randn(96).to(dtype)
    out = cpu_layer_ops.rms_norm(x, weight, 1e-6, adds_one)
    assert out is not None and out.dtype == dtype
    assert_equal_for(dtype, out, torch_rms_norm(x, weight, 1e-6, adds_one))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("adds_one", [False, True])
def test_add_rms_norm_sums_into_the_residual_then_normalizes(dtype, adds_one):
    torch.manual_seed(7)
    x, residual = (torch.randn(2, 37, 96) * 3).to(dtype), (torch.randn(2, 37, 96) * 3).to(dtype)
    weight = torch.randn(96).to(dtype)
    expected_sum = residual + x
    out = cpu_layer_ops.add_rms_norm(x, residual, weight, 1e-6, adds_one)
    assert out is not None and out.dtype == dtype
    assert torch.equal(residual, expected_sum)
    assert_equal_for(dtype, out, torch_rms_norm(expected_sum, weight, 1e-6, adds_one))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 100, 7])
def test_silu_and_mul_equals_torch(dtype, width):
    torch.manual_seed(width)
    gate_up = (torch.randn(23, 2 * width) * 4).to(dtype)
    gate, up = gate_up.split(width, dim=-1)
    out = cpu_layer_ops.silu_and_mul(gate_up)
    assert out is not None and out.shape == (23, width) and out.dtype == dtype
    assert_equal_for(dtype, out, torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 64), (128, 128), (80, 40), (32, 16)])
def test_rope_in_place_on_a_fused_projection_equals_torch(dtype, head_dim, rotary_dim):
    torch.manual_seed(head_dim)
    num_tokens, num_heads, num_kv_heads = 19, 4, 2
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    angles = torch.randn(num_tokens, 1, rotary_dim // 2)
    cos, sin = (torch.cat((f(angles), f(angles)), dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    q = qkv[:, :num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    expected_q, expected_k = rope_reference(q, cos, sin), rope_reference(k, cos, sin)
    v = qkv[:, (num_heads + num_kv_heads) * head_dim:]
    v_before = v.clone()

    assert cpu_layer_ops.rotary_(q, cos, sin) is q and cpu_layer_ops.rotary_(k, cos, sin) is k
    assert_equal_for(dtype, q, expected_q)
    assert_equal_for(dtype, k, expected_k)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_from_a_fused_projection_writes_what_the_reference_writes(dtype):
    torch.manual_seed(5)
    num_kv_heads, head_dim = 3, 64
    qkv = torch.randn(7, (9 + 2 * num_kv_heads) * head_dim).to(dtype)
    key = qkv[:, 9 * head_dim:12 * head_dim].view(7, num_kv_heads, head_dim)
    value = qkv[:, 12 * head_dim:].view(7, num_kv_heads, head_dim)
    k_cache, v_cache = (torch.full((6, 4, num_kv_heads, head_dim), float("nan")).to(dtype) for _ in range(2))
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    slot_mapping = torch.tensor([21, 0, 5, 6, 7, 23, 12])
    assert cpu_layer_ops.store_kv(key, value, k_cache, v_cache, slot_mapping)
    store_kv_reference(key, value, expected_k, expected_v, slot_mapping)
    assert torch.equal(k_cache.nan_to_num(), expected_k.nan_to_num())
    assert torch.equal(v_cache.nan_to_num(), expected_v.nan_to_num())


def test_store_kv_refuses_a_slot_outside_the_pool_and_writes_nothing():
    key = value = torch.randn(2, 1, 32)
    k_cache, v_cache = torch.zeros(2, 4, 1, 32), torch.zeros(2, 4, 1, 32)
    with pytest.raises(IndexError, match="slot 8 is outside the pool of 8 slots"):
        cpu_layer_ops.store_kv(key, value, k_cache, v_cache, torch.tensor([3, 8]))
    assert not k_cache.any() and not v_cache.any()


def test_what_the_ops_cannot_serve_kernels_hands_to_torch(monkeypatch):
    x = torch.randn(4, 8, 32)
    transposed = x.transpose(0, 1)
    weight = torch.randn(32)
    assert cpu_layer_ops.rms_norm(transposed, weight, 1e-6, False) is None
    assert cpu_layer_ops.rms_norm(x.half(), weight.half(), 1e-6, False) is None
    torch.testing.assert_close(kernels.rms_norm(transposed, weight, 1e-6),
                               torch_rms_norm(transposed, weight, 1e-6, False))
    residual = torch.randn(8, 4, 32)
    normed, summed = kernels.add_rms_norm(transposed, residual.clone(), weight, 1e-6)  # torch's add, then norm
    torch.testing.assert_close(summed, residual + transposed)
    torch.testing.assert_close(normed, torch_rms_norm(residual + transposed, weight, 1e-6, False))
    assert cpu_layer_ops.silu_and_mul(x.transpose(1, 2)) is None
    gate, up = x.transpose(1, 2).chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_and_mul(x.transpose(1, 2)), torch.nn.functional.silu(gate) * up)
    cos, sin = torch.ones(4, 1, 32), torch.zeros(4, 1, 32)
    assert cpu_layer_ops.rotary_(x[:, ::2], cos, sin) is None  # heads not contiguous
    torch.testing.assert_close(kernels.apply_rope(x[:, ::2], cos, sin), x[:, ::2])  # cos 1, sin 0
    k_cache, v_cache = torch.zeros(4, 2, 4, 32), torch.zeros(4, 2, 4, 32)
    assert not cpu_layer_ops.store_kv(x.half(), x.half(), k_cache, v_cache, torch.arange(4))  # dtypes differ
    assert not cpu_layer_ops.store_kv(x[:, ::2], x[:, ::2], k_cache, v_cache, torch.arange(4))  # heads apart
    kernels.store_kv(x[:, ::2], x[:, ::2], k_cache, v_cache, torch.arange(4))  # the reference writes them
    assert torch.equal(k_cache.view(8, 4, 32)[:4], x[:, ::2]) and not v_cache.view(8, 4, 32)[4:].any()
    monkeypatch.setenv("PDSERVE_CPU_KERNELS", "0")
    cpu_layer_ops.load.cache_clear()
    assert cpu_layer_ops.rms_norm(x, weight, 1e-6, False) is None
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-6, True), torch_rms_norm(x, weight, 1e-6, True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_serves_each_op_with_the_compiled_op_where_it_can(dtype):
    torch.manual_seed(3)
    x, residual = (torch.randn(9, 64) * 3).to(dtype), (torch.randn(9, 64) * 3).to(dtype)
    weight = torch.randn(64).to(dtype)
    assert torch.equal(kernels.rms_norm(x, weight, 1e-6, True), cpu_layer_ops.rms_norm(x, weight, 1e-6, True))
    expected_residual = residual.clone()
    expected = cpu_layer_ops.add_rms_norm(x, expected_residual, weight, 1e-6, False)
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(normed, expected) and torch.equal(summed, expected_residual) and summed is residual
    assert torch.equal(kernels.silu_and_mul(x), cpu_layer_ops.silu_and_mul(x))
    q = x.view(9, 2, 32)
    cos, sin = torch.randn(9, 1, 32).to(dtype), torch.randn(9, 1, 32).to(dtype)
    expected_q = cpu_layer_ops.rotary_(q.clone(), cos, sin)
    assert kernels.apply_rope(q, cos, sin) is q and torch.equal(q, expected_q)
    k_cache, v_cache = torch.zeros(3, 4, 2, 32, dtype=dtype), torch.zeros(3, 4, 2, 32, dtype=dtype)
    kernels.store_kv(q, q, k_cache, v_cache, torch.tensor([11, 0, 4, 1, 2, 3, 5, 6, 7]))
    assert torch.equal(k_cache.view(12, 2, 32)[11], q[0]) and torch.equal(v_cache.view(12, 2, 32)[7], q[8])
