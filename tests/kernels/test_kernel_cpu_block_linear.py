"""GGUF's block-quantized weights (Q8_0, Q4_0, Q4_1): the torch reference
(kernels/block_quant_reference.py) quantizes and dequantizes as gguf's numpy code does, bit for bit,
and the compiled CPU kernel (kernels/cpu_block_linear.py) equals the reference: its dequantized
weights bit for bit (float32, and bfloat16 rounded as torch rounds), its products but for float32
summation order, each row's product the same whatever rows and threads it is computed with. With
AVX512-BF16, bfloat16 x multiplies the weight rounded to bfloat16 (the bfloat16 dequantization), so
its reference is x.float() @ dequantize(blocks).bfloat16().float().T. The portable C (AVX-512 and
F16C off) and the AVX-512 build without AVX512-BF16 are held to the same. What the kernel cannot serve gives None, the
caller's cue to run the reference; what the reference rejects too raises ValueError.

The kernel is built by the system C compiler into a cache directory private to this module.
"""
import gguf
import numpy as np
import pytest
import torch

from pdserve.kernels import cpu_block_linear
from pdserve.kernels.block_quant_reference import (
    BLOCK_TYPES,
    block_linear_reference,
    dequantize_reference,
    quantize_reference,
)
from tests.kernels.conftest import built_in_private_cache, built_without_avx512

TYPES = list(BLOCK_TYPES)
GGML_TYPES = {name: gguf.GGMLQuantizationType[name.upper()] for name in TYPES}
# Odd output features; in-features of one block, SmolLM2's hidden and MLP widths.
REFERENCE_SHAPES = [(7, 32), (7, 576), (9, 1536)]
# Kernel shapes: 150 features leave remainders after tiles of 16, 8 and 4 and are enough for the
# kernel's prefetch to reach ahead; 2112 in-features take two chunks of block scales.
KERNEL_SHAPES = [(150, 576), (21, 2112)]


def weight_of(num_features: int, in_features: int, seed: int) -> torch.Tensor:
    """Random rows of varied scale, one block all zeros (d = 0) and one of a single magnitude."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(num_features, in_features, generator=generator)
    weight *= torch.rand(num_features, 1, generator=generator) * 0.1
    weight[0, :32] = 0.0
    weight[-1, :32] = torch.tensor([0.25, -0.25]).repeat(16)
    return weight


def random_blocks(num_features: int, in_features: int, block_type: str, seed: int) -> torch.Tensor:
    """Arbitrary bytes, each fp16 field's exponent kept below 16 (finite, subnormals included)."""
    block_bytes = BLOCK_TYPES[block_type].block_bytes
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (num_features, in_features // 32, block_bytes), dtype=torch.uint8,
                           generator=generator)
    blocks[..., 1] &= 0xBF
    if block_type == "q4_1":
        blocks[..., 3] &= 0xBF
    return blocks.reshape(num_features, -1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", REFERENCE_SHAPES, ids=str)
def test_reference_quantizes_as_gguf(block_type, shape):
    weight = weight_of(*shape, seed=shape[1])
    expected = gguf.quants.quantize(weight.numpy(), GGML_TYPES[block_type])
    assert np.array_equal(quantize_reference(weight, block_type).numpy(), expected)


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", REFERENCE_SHAPES, ids=str)
def test_reference_dequantizes_as_gguf_bit_for_bit(block_type, shape):
    quantized = torch.from_numpy(gguf.quants.quantize(weight_of(*shape, seed=1).numpy(), GGML_TYPES[block_type]))
    for blocks in (quantized, random_blocks(*shape, block_type, seed=2)):
        expected = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), GGML_TYPES[block_type]))
        assert torch.equal(bits(dequantize_reference(blocks, block_type)), bits(expected))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The wrapper's library, built in a private cache for this module's tests."""
    yield from built_in_private_cache(tmp_path_factory, cpu_block_linear.load)


@pytest.fixture(scope="module")
def portable(compiled):
    """The library built from the portable C alone."""
    library = cpu_block_linear.build(("-mno-avx512f", "-mno-f16c"))
    assert library is not None
    return library


@pytest.fixture(scope="module")
def without_avx512(compiled):
    """The library built with AVX-512 off: the AVX2 tiles where the CPU has AVX2, FMA and F16C, else
    the portable C."""
    library = built_without_avx512(cpu_block_linear.build, cpu_block_linear.load)
    assert library is not None
    return library


@pytest.fixture(scope="module")
def without_bf16(compiled):
    """The library built with AVX-512 but not AVX512-BF16 (bfloat16 x widened to float32)."""
    library = cpu_block_linear.build(("-mno-avx512bf16",))
    assert library is not None and not cpu_block_linear.rounds_bfloat16_weights(library)
    return library


@pytest.fixture(scope="module")
def weights():
    """(block_type, shape) -> blocks, quantized as gguf quantizes, with random bytes in the last row."""
    made = {}
    for block_type in TYPES:
        for shape in KERNEL_SHAPES:
            blocks = quantize_reference(weight_of(*shape, seed=3), block_type)
            blocks[-1] = random_blocks(1, shape[1], block_type, seed=4)[0]
            made[block_type, shape] = blocks
    return made


def assert_close_to(out: torch.Tensor, expected: torch.Tensor):
    """Equal but for float32 summation order, relative to the output's scale; a bfloat16 output
    may sit one bfloat16 step away where the float32 sums straddle a rounding edge."""
    assert out.dtype == expected.dtype and out.shape == expected.shape
    scale = expected.float().abs().max().item()
    rtol = 8e-3 if out.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-4 * scale, rtol=rtol)


def expected_product(x: torch.Tensor, blocks: torch.Tensor, block_type: str, rounds_bfloat16_weights: bool):
    """The reference of block_linear's product, in float32: with bfloat16 x and
    rounds_bfloat16_weights, by the weight rounded to bfloat16; else by the exact float32 weight
    (block_linear_reference's)."""
    weight = dequantize_reference(blocks, block_type)
    if x.dtype == torch.bfloat16 and rounds_bfloat16_weights:
        weight = weight.to(torch.bfloat16).float()
    return x.float() @ weight.T


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=str)
def test_dequantize_equals_the_reference_bit_for_bit(compiled, weights, threads, block_type, shape):
    blocks = weights[block_type, shape]
    expected = dequantize_reference(blocks, block_type)
    for num_threads in (1, 2):
        threads(num_threads)
        assert torch.equal(bits(cpu_block_linear.dequantize(blocks, block_type, torch.float32)), bits(expected))
        assert torch.equal(bits(cpu_block_linear.dequantize(blocks, block_type, torch.bfloat16)),
                           bits(expected.to(torch.bfloat16)))
    out = torch.full(expected.shape, float("nan"))
    assert cpu_block_linear.dequantize(blocks, block_type, torch.float32, out=out) is out
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("num_rows", [1, 3, 8, 17, 64])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_block_linear_equals_the_reference(compiled, weights, threads, block_type, num_rows, num_threads):
    threads(num_threads)
    generator = torch.Generator().manual_seed(num_rows)
    for shape in KERNEL_SHAPES:
        blocks = weights[block_type, shape]
        x = torch.randn(num_rows, shape[1], generator=generator)
        for dtype in (torch.float32, torch.bfloat16):
            expected = expected_product(x.to(dtype), blocks, block_type, cpu_block_linear.rounds_bfloat16_weights())
            out = cpu_block_linear.block_linear(x.to(dtype), blocks, block_type)
            assert_close_to(out, expected.to(dtype))
            # the float32 sums, before the wrapper rounds bfloat16 x's product
            status, raw = raw_block_linear(cpu_block_linear.load(), x.to(dtype), blocks, block_type, shape[1],
                                           num_threads)
            assert status == 0
            assert_close_to(raw, expected)


def test_bfloat16_x_multiplies_the_rounded_weight_where_the_cpu_has_avx512_bf16(compiled):
    """Where the build has AVX512-BF16 (so the CPU has it), the float32 product of bfloat16 x is
    nearer the rounded weight's than the exact weight's: the two differ by far more than summation
    order does."""
    if not cpu_block_linear.rounds_bfloat16_weights():
        pytest.skip("built without AVX512-BF16")
    blocks = quantize_reference(weight_of(64, 576, seed=7), "q8_0")
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    out = raw_block_linear(cpu_block_linear.load(), x, blocks, "q8_0", 576)[1]
    rounded = x.float() @ dequantize_reference(blocks, "q8_0").to(torch.bfloat16).float().T
    exact = x.float() @ dequantize_reference(blocks, "q8_0").T
    assert (out - rounded).abs().max() * 20 < (out - exact).abs().max()


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_rows_product_does_not_depend_on_its_batch_or_threads(compiled, weights, threads, block_type, dtype):
    """Tiles of 16 features by 1 row, 8 by 2, 4 by 4, with bfloat16 x 2 by 8, and the remainders
    all sum in one order (compared in float32, before the wrapper rounds bfloat16 x's product)."""
    shape = KERNEL_SHAPES[0]
    blocks = weights[block_type, shape]
    x = torch.randn(23, shape[1], generator=torch.Generator().manual_seed(5)).to(dtype)
    library = cpu_block_linear.load()

    def product(rows: torch.Tensor, num_threads: int) -> torch.Tensor:
        status, out = raw_block_linear(library, rows.contiguous(), blocks, block_type, shape[1], num_threads)
        assert status == 0
        return out

    full = product(x, 1)
    for first, count in [(0, 1), (16, 1), (0, 2), (3, 3), (4, 5), (1, 16), (2, 8), (5, 9), (7, 15), (0, 17)]:
        assert torch.equal(product(x[first : first + count], 1), full[first : first + count])
    assert torch.equal(product(x, 2), full)
    assert torch.equal(product(x[:1], 2), full[:1])
    assert torch.equal(product(x[:12], 2), full[:12])
    threads(2)
    assert torch.equal(cpu_block_linear.block_linear(x, blocks, block_type), full.to(dtype))


def raw_block_linear(library, x: torch.Tensor, blocks: torch.Tensor, block_type: str, in_features: int,
                     num_threads: int = 1) -> tuple:
    out = torch.empty(x.shape[0], blocks.shape[0])
    status = library.block_linear(out.data_ptr(), x.data_ptr(), blocks.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                  x.shape[0], blocks.shape[0], in_features, x.dtype == torch.bfloat16, num_threads)
    return status, out


def raw_dequantize(library, blocks: torch.Tensor, block_type: str, dtype: torch.dtype) -> tuple:
    in_features = blocks.shape[1] // BLOCK_TYPES[block_type].block_bytes * 32
    out = torch.empty(blocks.shape[0], in_features, dtype=dtype)
    status = library.block_dequantize(out.data_ptr(), blocks.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                      blocks.shape[0], in_features, dtype == torch.bfloat16, 1)
    return status, out


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("variant", ["portable", "without_avx512", "without_bf16"])
def test_the_narrower_builds_equal_the_reference(request, weights, threads, block_type, variant):
    library = request.getfixturevalue(variant)
    assert not cpu_block_linear.rounds_bfloat16_weights(library)
    shape = KERNEL_SHAPES[1]
    blocks = weights[block_type, shape]
    expected = dequantize_reference(blocks, block_type)
    for dtype in (torch.float32, torch.bfloat16):
        status, out = raw_dequantize(library, blocks, block_type, dtype)
        assert status == 0 and torch.equal(bits(out), bits(expected.to(dtype)))
    x = torch.randn(9, shape[1], generator=torch.Generator().manual_seed(6))
    for dtype in (torch.float32, torch.bfloat16):
        status, out = raw_block_linear(library, x.to(dtype), blocks, block_type, shape[1])
        assert status == 0
        assert_close_to(out.to(dtype), block_linear_reference(x.to(dtype), blocks, block_type))
        for first, count in [(0, 1), (3, 2), (1, 8)]:  # rows do not depend on their batch here either
            status, part = raw_block_linear(library, x[first : first + count].to(dtype), blocks, block_type, shape[1])
            assert status == 0 and torch.equal(part, out[first : first + count])


def test_what_the_kernel_cannot_serve_gives_none(compiled, weights):
    blocks = weights["q4_1", KERNEL_SHAPES[0]]
    x = torch.randn(2, KERNEL_SHAPES[0][1])
    assert cpu_block_linear.block_linear(x.half(), blocks, "q4_1") is None
    assert cpu_block_linear.block_linear(torch.randn(x.shape[1], 2).T, blocks, "q4_1") is None  # not contiguous
    assert cpu_block_linear.dequantize(blocks, "q4_1", torch.float16) is None
    assert cpu_block_linear.dequantize(blocks[:, :40].T.contiguous().T, "q4_1", torch.float32) is None
    out = torch.empty(KERNEL_SHAPES[0][1], KERNEL_SHAPES[0][0]).T  # the right shape, not contiguous
    assert cpu_block_linear.dequantize(blocks, "q4_1", torch.float32, out=out) is None


def test_disabled_it_serves_nothing(compiled, weights, monkeypatch):
    blocks = weights["q8_0", KERNEL_SHAPES[0]]
    monkeypatch.setenv("PDSERVE_CPU_KERNELS", "0")
    cpu_block_linear.load.cache_clear()
    try:
        assert cpu_block_linear.load() is None
        assert cpu_block_linear.block_linear(torch.randn(1, KERNEL_SHAPES[0][1]), blocks, "q8_0") is None
        assert cpu_block_linear.dequantize(blocks, "q8_0", torch.float32) is None
    finally:
        cpu_block_linear.load.cache_clear()


def test_arguments_the_reference_rejects_raise_value_error(compiled, weights):
    """A width that is no multiple of 32 can match no block weight: ValueError from the wrapper
    and the reference alike (the C function, called directly, returns 1)."""
    blocks = weights["q4_0", KERNEL_SHAPES[0]]
    in_features = KERNEL_SHAPES[0][1]
    for function in (cpu_block_linear.block_linear, block_linear_reference):
        with pytest.raises(ValueError):
            function(torch.randn(2, in_features + 8), blocks, "q4_0")
        with pytest.raises(ValueError):
            function(torch.randn(2, in_features), blocks, "q5_0")
        with pytest.raises(ValueError):
            function(torch.randn(2, in_features), blocks[:, :-1].contiguous(), "q4_0")
    with pytest.raises(ValueError):
        cpu_block_linear.dequantize(blocks, "q2_k", torch.float32)
    with pytest.raises(ValueError):
        cpu_block_linear.dequantize(blocks, "q4_0", torch.float32, out=torch.empty(blocks.shape[0], in_features + 32))
    with pytest.raises(ValueError):
        quantize_reference(torch.randn(3, 40), "q8_0")
    library = cpu_block_linear.load()
    x = torch.randn(2, in_features + 8)
    assert raw_block_linear(library, x, blocks, "q4_0", in_features + 8)[0] == 1
    assert library.block_dequantize(x.data_ptr(), blocks.data_ptr(), 2, blocks.shape[0], in_features + 8, 0, 1) == 1
    assert library.block_dequantize(x.data_ptr(), blocks.data_ptr(), 5, blocks.shape[0], in_features, 0, 1) == 1
