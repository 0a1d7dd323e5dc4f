"""W8A8 int8 products (kernels/int8_linear.py): `quantize_rows` scales each row by its largest
magnitude / 127 and rounds half to even (a row of zeros: scale 0), compiled or not, each column
first multiplied by its input factor where given; `int8_linear` on CPU (oneDNN's int8 GEMM) equals
`int8_linear_reference` (float32 sums of levels, exact below 2^24) to the last bit of its output
dtype, at every row count a step gives it, with and without bias; and both are within the
rounding of levels of the float product."""
import pytest
import torch

from pdserve.kernels.int8_levels import MAX_LEVEL
from pdserve.kernels.int8_linear import int8_linear, int8_linear_reference, quantize_rows, quantize_rows_reference

# (rows, in, out): a decode step's few rows, a prefill chunk's many, odd widths; in <= 1040 keeps
# the reference's float32 sums exact.
SHAPES = [(1, 576, 960), (3, 40, 24), (16, 576, 3072), (130, 1024, 77)]


@pytest.mark.parametrize("quantize", [quantize_rows, quantize_rows_reference], ids=lambda f: f.__name__)
def test_rows_are_scaled_by_their_largest_magnitude_and_rounded_half_to_even(quantize):
    x = torch.tensor([[127.0, -63.5, 0.5, 1.5] * 5, [0.0] * 20, [-2.54, 1.27, 0.0, 0.0] * 5])  # 20: a tail past 16
    levels, scales = quantize(x)
    assert levels.dtype == torch.int8 and scales.dtype == torch.float32
    assert scales.tolist() == pytest.approx([1.0, 0.0, 0.02])
    assert levels.tolist() == [[127, -64, 0, 2] * 5, [0] * 20, [-127, 64, 0, 0] * 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_levels_equal_the_reference_and_reconstruct_rows_within_half_a_step(dtype):
    x = torch.randn(64, 300, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)[:, None]
    x = x.to(dtype)
    levels, scales = quantize_rows(x)
    reference = quantize_rows_reference(x)
    assert torch.equal(levels, reference[0]) and torch.equal(scales, reference[1])
    assert (levels.abs().amax(dim=1) == MAX_LEVEL).all()
    assert ((levels.float() * scales[:, None] - x.float()).abs() <= scales[:, None] * (0.5 + 1e-4)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_factors", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_cpu_product_equals_the_reference(shape, with_factors, with_bias, dtype):
    rows, in_features, out_features = shape
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=generator).to(dtype)
    x[0] = 0  # a row of zeros
    levels, scales = quantize_rows(torch.randn(out_features, in_features, generator=generator) * 0.05)
    bias = torch.randn(out_features, generator=generator).to(dtype) if with_bias else None
    factors = torch.rand(in_features, generator=generator) + 0.5 if with_factors else None
    out = int8_linear(x, levels, scales, bias, factors)
    assert out.dtype == dtype and out.shape == (rows, out_features)
    torch.testing.assert_close(out, int8_linear_reference(x, levels, scales, bias, factors), rtol=0, atol=0)


def test_the_product_is_the_float_product_within_the_rounding_of_levels():
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(32, 576, generator=generator), torch.randn(960, 576, generator=generator)
    exact = x @ weight.T
    out = int8_linear(x, *quantize_rows(weight), None)
    relative_error = (out - exact).norm() / exact.norm()
    assert 1e-4 < relative_error < 0.02, relative_error  # ~0.7 %: levels of 1/127 of each row's peak
