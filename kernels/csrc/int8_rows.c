/* The two passes around an int8 GEMM (kernels/int8_linear.py), one pass over memory each where
 * torch takes four or five:
 *   quantize_rows  levels [num_rows, cols] int8, scales [num_rows] float32 of x [num_rows, cols],
 *                  each column times factors [cols] (NULL: none) first (int8_levels.h: as
 *                  kernels/int8_levels.py computes them)
 *   scale_rows     out [num_rows, cols] = products [num_rows, cols] int32 * row_scales[r] *
 *                  col_scales[c] in float32, rounded to the dtype, plus bias [cols] (NULL: none)
 *                  rounded again, as torch's mul, mul_, to and add_ round
 * Tensors of the dtype hold float32, or bfloat16 when built with -DBFLOAT16; all contiguous.
 */
#include "int8_levels.h"

void quantize_rows(int8_t *levels, float *scales, const elem_t *x, const float *factors, int64_t num_rows,
                   int64_t cols) {
    for (int64_t r = 0; r < num_rows; r++) scales[r] = quantize_row(levels + r * cols, x + r * cols, factors, cols);
}

void scale_rows(elem_t *out, const int32_t *products, const float *row_scales, const float *col_scales,
                const elem_t *bias, int64_t num_rows, int64_t cols) {
    for (int64_t r = 0; r < num_rows; r++) {
        const int32_t *restrict in = products + r * cols;
        elem_t *restrict out_row = out + r * cols;
        const float row_scale = row_scales[r];
        if (bias == 0) {
#pragma omp simd
            for (int64_t i = 0; i < cols; i++) out_row[i] = store((float)in[i] * row_scale * col_scales[i]);
        } else {
#pragma omp simd
            for (int64_t i = 0; i < cols; i++)
                out_row[i] = store(load(store((float)in[i] * row_scale * col_scales[i])) + load(bias[i]));
        }
    }
}
