"""GGUF's K-quant weights (Q4_K, Q6_K): the torch reference (kernels/kquant_reference.py)
dequantizes as gguf's numpy code does, bit for bit, and the compiled CPU kernel
(kernels/cpu_kquant_linear.py) equals the reference: its dequantized weights bit for bit (float32,
and bfloat16 rounded as torch rounds), its products but for float32 summation order, each row's
product the same whatever rows and threads it is computed with. With AVX512-BF16, bfloat16 x
multiplies the weight rounded to bfloat16. The portable C (AVX-512 and F16C off) and the AVX-512
build without AVX512-BF16 are held to the same. What the kernel cannot serve gives None; what the
reference rejects too raises ValueError.

gguf cannot quantize the K types, so the weights are random bytes (every bit pattern of the
scales, mins and quants), their fp16 fields kept finite, subnormals included, and one super-block
all zeros.
"""
import gguf
import pytest
import torch

from pdserve.kernels import cpu_kquant_linear
from pdserve.kernels.kquant_reference import K_BLOCK_TYPES, block_linear_reference, dequantize_reference
from tests.kernels.conftest import built_in_private_cache

TYPES = list(K_BLOCK_TYPES)
GGML_TYPES = {name: gguf.GGMLQuantizationType[name.upper()] for name in TYPES}
FP16_OFFSETS = {"q4_k": (0, 2), "q6_k": (208,)}  # byte offsets of each super-block's fp16 fields
# 37 features; 3 super-blocks a row. Rows of x: one, a few, past one pass of 16 rows.
SHAPE = (37, 768)
NUM_ROWS = [1, 3, 8, 13, 17]


def random_blocks(num_features: int, in_features: int, block_type: str, seed: int) -> torch.Tensor:
    """Arbitrary bytes, each fp16 field's exponent kept below 16 (finite, subnormals included),
    scaled down so products stay near 1; the first super-block all zeros."""
    kind = K_BLOCK_TYPES[block_type]
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (num_features, in_features // 256, kind.block_bytes), dtype=torch.uint8,
                           generator=generator)
    for offset in FP16_OFFSETS[block_type]:
        blocks[..., offset + 1] &= 0x9F  # sign, exponent < 8: |value| < 2^-7
    blocks[0, 0] = 0
    return blocks.reshape(num_features, -1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("shape", [(1, 256), (9, 1024)], ids=str)
def test_reference_dequantizes_as_gguf_bit_for_bit(block_type, shape):
    for seed in (1, 2):
        blocks = random_blocks(*shape, block_type, seed)
        expected = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), GGML_TYPES[block_type]))
        assert torch.equal(bits(dequantize_reference(blocks, block_type)), bits(expected))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The wrapper's library, built in a private cache for this module's tests."""
    yield from built_in_private_cache(tmp_path_factory, cpu_kquant_linear.load)


@pytest.fixture(scope="module")
def weights():
    return {block_type: random_blocks(*SHAPE, block_type, seed=3) for block_type in TYPES}


def assert_close_to(out: torch.Tensor, expected: torch.Tensor):
    """Equal but for float32 summation order, relative to the output's scale; a bfloat16 output
    may sit one bfloat16 step away where the float32 sums straddle a rounding edge."""
    assert out.dtype == expected.dtype and out.shape == expected.shape
    scale = expected.float().abs().max().item()
    rtol = 8e-3 if out.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-4 * scale, rtol=rtol)


def expected_product(x: torch.Tensor, blocks: torch.Tensor, block_type: str, rounds_bfloat16_weights: bool):
    """block_linear's product in float32: by the weight rounded to bfloat16 for bfloat16 x where
    the library multiplies bfloat16 pairs, else by the exact float32 weight."""
    weight = dequantize_reference(blocks, block_type)
    if x.dtype == torch.bfloat16 and rounds_bfloat16_weights:
        weight = weight.to(torch.bfloat16).float()
    return x.float() @ weight.T


def raw_block_linear(library, x: torch.Tensor, blocks: torch.Tensor, block_type: str, num_threads: int = 1):
    out = torch.empty(x.shape[0], blocks.shape[0])
    status = library.kquant_linear(out.data_ptr(), x.data_ptr(), blocks.data_ptr(), K_BLOCK_TYPES[block_type].ggml_type,
                                   x.shape[0], blocks.shape[0], x.shape[1], x.dtype == torch.bfloat16, num_threads)
    assert status == 0
    return out


def raw_dequantize(library, blocks: torch.Tensor, block_type: str, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(blocks.shape[0], SHAPE[1], dtype=dtype)
    status = library.kquant_dequantize(out.data_ptr(), blocks.data_ptr(), K_BLOCK_TYPES[block_type].ggml_type,
                                       blocks.shape[0], SHAPE[1], dtype == torch.bfloat16, 1)
    assert status == 0
    return out


@pytest.mark.parametrize("block_type", TYPES)
def test_dequantize_equals_the_reference_bit_for_bit(compiled, weights, threads, block_type):
    blocks = weights[block_type]
    expected = dequantize_reference(blocks, block_type)
    for num_threads in (1, 2):
        threads(num_threads)
        assert torch.equal(bits(cpu_kquant_linear.dequantize(blocks, block_type, torch.float32)), bits(expected))
        assert torch.equal(bits(cpu_kquant_linear.dequantize(blocks, block_type, torch.bfloat16)),
                           bits(expected.to(torch.bfloat16)))
    out = torch.full(expected.shape, float("nan"))
    assert cpu_kquant_linear.dequantize(blocks, block_type, torch.float32, out=out) is out
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("num_threads", [1, 2])
def test_block_linear_equals_the_reference(compiled, weights, threads, block_type, num_threads):
    threads(num_threads)
    blocks = weights[block_type]
    for num_rows in NUM_ROWS:
        x = torch.randn(num_rows, SHAPE[1], generator=torch.Generator().manual_seed(num_rows))
        for dtype in (torch.float32, torch.bfloat16):
            expected = expected_product(x.to(dtype), blocks, block_type, cpu_kquant_linear.rounds_bfloat16_weights())
            assert_close_to(cpu_kquant_linear.block_linear(x.to(dtype), blocks, block_type), expected.to(dtype))
            # the float32 sums, before the wrapper rounds bfloat16 x's product
            assert_close_to(raw_block_linear(cpu_kquant_linear.load(), x.to(dtype), blocks, block_type, num_threads),
                            expected)


@pytest.mark.parametrize("block_type", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_rows_product_does_not_depend_on_its_batch_or_threads(compiled, weights, threads, block_type, dtype):
    blocks = weights[block_type]
    x = torch.randn(23, SHAPE[1], generator=torch.Generator().manual_seed(5)).to(dtype)
    library = cpu_kquant_linear.load()
    full = raw_block_linear(library, x, blocks, block_type)
    for first, count in [(0, 1), (16, 1), (3, 3), (4, 5), (1, 16), (5, 17)]:
        assert torch.equal(raw_block_linear(library, x[first : first + count].contiguous(), blocks, block_type),
                           full[first : first + count])
    assert torch.equal(raw_block_linear(library, x, blocks, block_type, num_threads=2), full)
    threads(2)
    assert torch.equal(cpu_kquant_linear.block_linear(x, blocks, block_type), full.to(dtype))


@pytest.mark.parametrize("flags", [("-mno-avx512f", "-mno-f16c"), ("-mno-avx512bf16",)], ids=["portable", "no-bf16"])
def test_the_portable_c_and_the_build_without_bf16_equal_the_reference(compiled, weights, flags):
    library = cpu_kquant_linear.build(flags)
    assert library is not None and not cpu_kquant_linear.rounds_bfloat16_weights(library)
    x = torch.randn(9, SHAPE[1], generator=torch.Generator().manual_seed(6))
    for block_type in TYPES:
        blocks = weights[block_type]
        expected = dequantize_reference(blocks, block_type)
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(bits(raw_dequantize(library, blocks, block_type, dtype)), bits(expected.to(dtype)))
            out = raw_block_linear(library, x.to(dtype), blocks, block_type)
            assert_close_to(out.to(dtype), block_linear_reference(x.to(dtype), blocks, block_type))
            for first, count in [(0, 1), (3, 2), (1, 8)]:  # rows do not depend on their batch here either
                part = raw_block_linear(library, x[first : first + count].to(dtype), blocks, block_type)
                assert torch.equal(part, out[first : first + count])


def test_what_the_kernel_cannot_serve_gives_none_and_what_the_reference_rejects_raises(compiled, weights):
    blocks = weights["q4_k"]
    x = torch.randn(2, SHAPE[1])
    assert cpu_kquant_linear.block_linear(x.half(), blocks, "q4_k") is None
    assert cpu_kquant_linear.block_linear(torch.randn(SHAPE[1], 2).T, blocks, "q4_k") is None  # not contiguous
    assert cpu_kquant_linear.dequantize(blocks, "q4_k", torch.float16) is None
    for function in (cpu_kquant_linear.block_linear, block_linear_reference):
        with pytest.raises(ValueError):
            function(torch.randn(2, SHAPE[1] + 32), blocks, "q4_k")  # a 32-weight block more: no super-block
        with pytest.raises(ValueError):
            function(x, blocks, "q5_k")
        with pytest.raises(ValueError):
            function(x, blocks[:, :-1].contiguous(), "q4_k")
    library = cpu_kquant_linear.load()
    assert library.kquant_dequantize(x.data_ptr(), blocks.data_ptr(), 12, 1, SHAPE[1] + 32, 0, 1) == 1
    assert library.kquant_dequantize(x.data_ptr(), blocks.data_ptr(), 13, 1, SHAPE[1], 0, 1) == 1
