"""The Triton block-linear kernels (kernels/triton_block_linear.py) equal the reference
(kernels/block_quant_reference.py), under the interpreter and on a GPU: `dequantize` bit for bit,
in float32 and rounded to bfloat16 and float16; `block_linear` within a bound on float32
summation order (plus, on a GPU's tensor cores, the weight's rounding to x's dtype).

Weights are gguf's quantization of random rows of varied scale, one block all zeros (d = 0);
dequantizing also reads arbitrary bytes (every nibble, int8 and fp16 scale, subnormals, infinities
and NaNs included). Shapes: one row (a decode step), a few and more than a row tile; 16 and 40
output features; one block and three. Each product runs with the default tiles, and the widest
shape also with tiles of 16 rows, 16 features and one block of K (several tiles on every axis)
and with a K tile wider than the weight.
"""
import pytest
import torch

from pdserve.kernels.block_quant_reference import BLOCK_TYPES, dequantize_reference, quantize_reference
from pdserve.kernels.tile_dot import needs_exact_dot
from pdserve.kernels.triton_block_linear import Tiles, block_linear, dequantize

TYPES = list(BLOCK_TYPES)
SHAPES = [(num_rows, num_features, in_features)
          for num_rows in (1, 3, 17) for num_features in (16, 40) for in_features in (32, 96)]
WIDEST = (17, 40, 96)
SMALL_TILES = Tiles(rows=16, features=16, k=32)
WIDE_K_TILE = Tiles(k=128)


def quantized(num_features: int, in_features: int, block_type: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(num_features, in_features, generator=generator)
    weight *= torch.rand(num_features, 1, generator=generator) + 0.01
    weight[0, :32] = 0.0
    return quantize_reference(weight, block_type)


def arbitrary_blocks(num_features: int, in_features: int, block_type: str, seed: int) -> torch.Tensor:
    block_bytes = BLOCK_TYPES[block_type].block_bytes
    generator = torch.Generator().manual_seed(seed)
    shape = (num_features, in_features // 32 * block_bytes)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, but any NaN for a NaN (torch's casts do not agree on a NaN's payload)."""
    return bool(((bits(a) == bits(b)) | (a.isnan() & b.isnan())).all())


def assert_within_summation_bound(out, x, weight):
    """Each of kernel and reference sums in_features float32 products, each sum within
    in_features * 2^-24 of sum |x w| whatever its order (the classic bound on recursive
    summation), so they differ by at most twice that. Tensor cores (a GPU, x not float32) multiply
    the weight rounded to x's dtype, which adds its unit roundoff (2^-8 for bfloat16, 2^-11 for
    float16) of sum |x w|. Any unpacking error is of the order of sum |x w| itself."""
    in_features = x.shape[1]
    magnitude = x.float().abs() @ weight.abs().T  # [M, N]
    unit_roundoff = torch.finfo(torch.float32).eps / 2
    weight_rounding = 0.0 if needs_exact_dot(x.dtype) else torch.finfo(x.dtype).eps / 2
    bound = (2 * in_features * unit_roundoff + weight_rounding) * magnitude
    error = (out.cpu() - x.float() @ weight.T).abs()
    assert (error <= bound).all(), f"error {error.max().item():.3g} over a bound of {bound.min().item():.3g}"


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_type", TYPES)
def test_block_linear_equals_the_reference_product(block_type, x_dtype, device):
    for seed, (num_rows, num_features, in_features) in enumerate(SHAPES):
        blocks = quantized(num_features, in_features, block_type, seed)
        x = torch.randn(num_rows, in_features, generator=torch.Generator().manual_seed(seed)).to(x_dtype)
        weight = dequantize_reference(blocks, block_type)
        widest = (num_rows, num_features, in_features) == WIDEST
        launches = (Tiles(), SMALL_TILES, WIDE_K_TILE) if widest else (Tiles(),)
        for tiles in launches:
            out = block_linear(x.to(device), blocks.to(device), block_type, tiles=tiles)
            assert out.dtype == torch.float32 and out.shape == (num_rows, num_features)
            assert_within_summation_bound(out, x, weight)


def test_float16_x_and_a_product_in_x_dtype(device):
    """float16 x; the product rounded to bfloat16 at the end, as torch rounds the float32 sum."""
    blocks = quantized(40, 96, "q4_1", seed=7)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(7))
    weight = dequantize_reference(blocks, "q4_1")
    out = block_linear(x.half().to(device), blocks.to(device), "q4_1")
    assert_within_summation_bound(out, x.half(), weight)
    out = block_linear(x.to(device), blocks.to(device), "q4_1", out_dtype=torch.bfloat16)
    expected = block_linear(x.to(device), blocks.to(device), "q4_1").bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(bits(out), bits(expected))


@pytest.mark.filterwarnings("ignore:(invalid value|overflow):RuntimeWarning")  # numpy, on the NaNs and infinities
@pytest.mark.parametrize("block_type", TYPES)
def test_dequantize_equals_the_reference_bit_for_bit(block_type, device):
    for blocks in (quantized(40, 96, block_type, seed=1), arbitrary_blocks(40, 96, block_type, seed=2)):
        expected = dequantize_reference(blocks, block_type)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for tiles in (Tiles(), SMALL_TILES):
                out = dequantize(blocks.to(device), block_type, dtype, tiles=tiles)
                assert out.dtype == dtype and same_values(out.cpu(), expected.to(dtype))


def test_dequantize_writes_into_a_strided_out(device):
    blocks = quantized(16, 64, "q8_0", seed=3)
    buffer = torch.full((16, 80), 7.0, dtype=torch.bfloat16, device=device)
    out = dequantize(blocks.to(device), "q8_0", torch.bfloat16, out=buffer[:, 8:72])
    assert out.data_ptr() == buffer[:, 8:].data_ptr()
    expected = dequantize_reference(blocks, "q8_0").bfloat16()
    assert torch.equal(bits(buffer[:, 8:72].cpu()), bits(expected))
    assert (buffer[:, :8] == 7).all() and (buffer[:, 72:] == 7).all()


def test_arguments_the_reference_rejects_are_refused(device):
    blocks = quantized(8, 64, "q4_0", seed=4).to(device)
    x = torch.randn(2, 64, device=device)
    with pytest.raises(ValueError, match="unknown block type"):
        block_linear(x, blocks, "q5_0")
    with pytest.raises(ValueError, match="unknown block type"):
        dequantize(blocks, "q2_k")
    with pytest.raises(ValueError, match="num_blocks"):
        block_linear(x, blocks[:, :-1], "q4_0")  # no whole number of 18-byte blocks
    with pytest.raises(ValueError, match="does not match"):
        block_linear(x[:, :32], blocks, "q4_0")  # the weight has 64 in-features
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        block_linear(x.double(), blocks, "q4_0")
    with pytest.raises(ValueError, match="is not"):
        dequantize(blocks, "q4_0", out=torch.empty(8, 32, device=device))


def test_tiles_that_are_not_powers_of_two_or_too_small_are_refused():
    for tiles in (dict(rows=24), dict(features=8), dict(k=16), dict(k=48)):
        with pytest.raises(ValueError, match="power of 2"):
            Tiles(**tiles)
