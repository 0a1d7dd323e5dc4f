"""Q4 weights packed for int8 activations (kernels/cpu_packed_q4_linear.py): packing keeps the
stored bytes (unpack gives them back), and the compiled product equals its torch reference (x
quantized per block of 32 as llama.cpp's Q8_1, the dot products exact) but for float32 summation
order, each row's product the same bit for bit whatever rows and threads it is computed with,
the portable C (AVX-512 and F16C off) equal to the vector code (AVX-512 or AVX2) bit for bit. It stays within about
1 % of the product with x unquantized on these random weights. What the kernel cannot serve gives
None; what it cannot take raises ValueError.

The kernel is built by the system C compiler into a cache directory private to this module.
"""
import pytest
import torch

from pdserve.kernels import cpu_packed_q4_linear
from pdserve.kernels.block_quant_reference import dequantize_reference, quantize_reference
from tests.kernels.conftest import built_in_private_cache, built_without_avx512
from tests.kernels.test_kernel_cpu_block_linear import assert_close_to, random_blocks, weight_of

TYPES = list(cpu_packed_q4_linear.PACKED_TYPES)
# 176 features: eleven groups, enough for the kernel's prefetch to reach ahead, and prefill strips
# of 4, 4 and 3 groups; in-features of one block and SmolLM2's MLP width.
SHAPES = [(176, 576), (32, 1536), (16, 32)]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The wrapper's library, built in a private cache for this module's tests."""
    yield from built_in_private_cache(tmp_path_factory, cpu_packed_q4_linear.load)


@pytest.fixture(scope="module")
def weights():
    """(block_type, shape) -> stored blocks, quantized as gguf quantizes, random bytes in the last row."""
    made = {}
    for block_type in TYPES:
        for shape in SHAPES:
            blocks = quantize_reference(weight_of(*shape, seed=3), block_type)
            blocks[-1] = random_blocks(1, shape[1], block_type, seed=4)[0]
            made[block_type, shape] = blocks
    return made


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unpack_gives_back_the_stored_blocks(compiled, weights, block_type, shape):
    blocks = weights[block_type, shape]
    packed = cpu_packed_q4_linear.pack(blocks, block_type)
    assert packed.shape == (shape[0] // 16, blocks.shape[1] * 16) and not torch.equal(packed.view(-1), blocks.view(-1))
    assert torch.equal(cpu_packed_q4_linear.unpack(packed, block_type), blocks)
    out = torch.zeros_like(blocks)
    assert cpu_packed_q4_linear.unpack(packed, block_type, out=out) is out and torch.equal(out, blocks)


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_linear_equals_the_reference(compiled, weights, threads, block_type, shape, dtype):
    blocks = weights[block_type, shape]
    packed = cpu_packed_q4_linear.pack(blocks, block_type)
    # tiles of 8, 4, 2 and 1 rows; from 16 rows, strips of 4, 2 and 1 rows in chunks of 32
    for num_rows, num_threads in [(1, 1), (3, 2), (8, 1), (23, 2), (39, 1)]:
        threads(num_threads)
        x = torch.randn(num_rows, shape[1], generator=torch.Generator().manual_seed(num_rows)).to(dtype)
        x[0, :32] = 0.0  # a block of zeros: no scale to divide by
        expected = cpu_packed_q4_linear.reference(x, blocks, block_type)
        assert_close_to(cpu_packed_q4_linear.linear(x, packed, block_type), expected.to(dtype))
        if block_type == "q4_1" and dtype == torch.float32 and shape[1] > 32:  # int8 x loses about 1 %
            unquantized = x.double() @ dequantize_reference(blocks, block_type).double().T
            assert (expected - unquantized).abs().max() <= 0.03 * unquantized.abs().max()


@pytest.mark.parametrize("block_type", TYPES)
def test_a_rows_product_does_not_depend_on_its_batch_or_threads(compiled, weights, threads, block_type):
    blocks = weights[block_type, SHAPES[0]]
    packed = cpu_packed_q4_linear.pack(blocks, block_type)
    x = torch.randn(41, SHAPES[0][1], generator=torch.Generator().manual_seed(5))
    threads(1)
    full = cpu_packed_q4_linear.linear(x, packed, block_type)
    for first, count in [(0, 1), (16, 1), (3, 3), (4, 5), (1, 16), (7, 15), (0, 9), (2, 33), (40, 1)]:
        assert torch.equal(cpu_packed_q4_linear.linear(x[first : first + count], packed, block_type),
                           full[first : first + count])
    threads(2)
    assert torch.equal(cpu_packed_q4_linear.linear(x, packed, block_type), full)


@pytest.mark.parametrize("block_type", TYPES)
def test_the_portable_c_equals_the_vector_code(compiled, weights, block_type):
    portable = cpu_packed_q4_linear.build(("-mno-avx512f", "-mno-f16c"))
    assert portable is not None
    blocks = weights[block_type, SHAPES[0]]
    packed = cpu_packed_q4_linear.pack(blocks, block_type)
    for num_rows in (11, 37):  # the vector code's groups and its strips
        x = torch.randn(num_rows, SHAPES[0][1], generator=torch.Generator().manual_seed(6))
        for dtype in (torch.float32, torch.bfloat16):
            out = cpu_packed_q4_linear.linear(x.to(dtype), packed, block_type, library=portable)
            assert torch.equal(out, cpu_packed_q4_linear.linear(x.to(dtype), packed, block_type))
    assert torch.equal(cpu_packed_q4_linear.unpack(packed, block_type), blocks)


@pytest.mark.parametrize("block_type", TYPES)
def test_the_build_without_avx512_equals_the_portable_c(compiled, weights, block_type):
    """Without AVX-512 the tiles are AVX2's where the CPU has AVX2, FMA and F16C: the same sums."""
    without_avx512 = built_without_avx512(cpu_packed_q4_linear.build, cpu_packed_q4_linear.load)
    portable = cpu_packed_q4_linear.build(("-mno-avx512f", "-mno-f16c"))
    assert without_avx512 is not None and portable is not None
    packed = cpu_packed_q4_linear.pack(weights[block_type, SHAPES[0]], block_type)
    for num_rows in (1, 3, 6, 11):  # tiles of 4, 2 and 1 rows
        x = torch.randn(num_rows, SHAPES[0][1], generator=torch.Generator().manual_seed(num_rows))
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(cpu_packed_q4_linear.linear(x.to(dtype), packed, block_type, library=without_avx512),
                               cpu_packed_q4_linear.linear(x.to(dtype), packed, block_type, library=portable))


def test_what_the_kernel_cannot_serve_gives_none(compiled, weights):
    packed = cpu_packed_q4_linear.pack(weights["q4_1", SHAPES[0]], "q4_1")
    x = torch.randn(2, SHAPES[0][1])
    assert cpu_packed_q4_linear.linear(x.half(), packed, "q4_1") is None
    assert cpu_packed_q4_linear.linear(torch.randn(x.shape[1], 2).T, packed, "q4_1") is None  # not contiguous
    assert cpu_packed_q4_linear.unpack(packed.T.contiguous().T, "q4_1") is None


def test_what_it_cannot_take_raises_value_error(compiled, weights):
    blocks = weights["q4_0", SHAPES[0]]
    packed = cpu_packed_q4_linear.pack(blocks, "q4_0")
    with pytest.raises(ValueError, match="does not match"):
        cpu_packed_q4_linear.linear(torch.randn(2, SHAPES[0][1] + 32), packed, "q4_0")
    with pytest.raises(ValueError, match="cannot be packed"):
        cpu_packed_q4_linear.pack(quantize_reference(torch.randn(16, 64), "q8_0"), "q8_0")
    with pytest.raises(ValueError, match="groups of 16"):
        cpu_packed_q4_linear.pack(blocks[:20], "q4_0")
    with pytest.raises(ValueError, match="packed q4_1"):
        cpu_packed_q4_linear.linear(torch.randn(2, SHAPES[0][1]), packed, "q4_1")  # q4_0's bytes
    with pytest.raises(ValueError, match="is not uint8"):
        cpu_packed_q4_linear.unpack(packed, "q4_0", out=torch.empty_like(blocks[:-16]))
    assert not cpu_packed_q4_linear.packs("q4_1", 20) and not cpu_packed_q4_linear.packs("q8_0", 32)
    assert cpu_packed_q4_linear.packs("q4_0", 32)
