"""The compiled CPU layer ops equal their torch references (kernels/layer_ops_reference.py):
RMSNorm (Llama's and Gemma's rounding), alone and after the residual add, rope over full and
partial rotary dims, in place on a view into a fused projection, and SiLU-and-multiply over widths
the vectors do and do not divide, in float32 and bfloat16 (bit for bit there but at rounding edges,
both rounding after every op); what they cannot serve, `kernels` hands to the references."""
import pytest
import torch

from pdserve import kernels
from pdserve.kernels import cpu_layer_ops
from pdserve.kernels.layer_ops_reference import rms_norm_reference as torch_rms_norm
from pdserve.kernels.layer_ops_reference import rope_reference

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
