/* A row of elements, each first multiplied by its column's factor where factors are given, as
 * symmetric int8 levels (kernels/int8_levels.py): scale = max |x| / 127, level = x / scale rounded
 * half to even; a row of zeros has scale 0 and zero levels. Float32 products and division as
 * torch computes them, so levels and scale equal the reference's bit for bit. */
#ifndef PDSERVE_INT8_LEVELS_H
#define PDSERVE_INT8_LEVELS_H

#include <math.h>
#include <string.h>

#include "elem.h"

#ifdef __AVX512F__
static inline __m512 load16_times(const elem_t *x, const float *factors, int64_t i) {
    return factors ? _mm512_mul_ps(load16(x + i), _mm512_loadu_ps(factors + i)) : load16(x + i);
}
#endif

static inline float load_times(const elem_t *x, const float *factors, int64_t i) {
    return factors ? load(x[i]) * factors[i] : load(x[i]);
}

/* Writes the levels [n] of x [n] times factors [n] (NULL: none) and returns their scale. */
static inline float quantize_row(int8_t *restrict levels, const elem_t *restrict x, const float *restrict factors,
                                 int64_t n) {
    float max_magnitude = 0.0f;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 maxima = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) maxima = _mm512_max_ps(maxima, _mm512_abs_ps(load16_times(x, factors, i)));
    max_magnitude = _mm512_reduce_max_ps(maxima);
#endif
    for (; i < n; i++) max_magnitude = fmaxf(max_magnitude, fabsf(load_times(x, factors, i)));
    const float scale = max_magnitude / 127.0f;
    if (scale == 0.0f) {
        memset(levels, 0, (size_t)n);
        return scale;
    }
    i = 0;
#ifdef __AVX512F__
    const __m512 scale16 = _mm512_set1_ps(scale);
    for (; i + 16 <= n; i += 16)  /* the conversion rounds half to even, as MXCSR is left */
        _mm_storeu_si128((__m128i *)(levels + i),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_div_ps(load16_times(x, factors, i), scale16))));
#endif
    for (; i < n; i++) levels[i] = (int8_t)nearbyintf(load_times(x, factors, i) / scale);
    return scale;
}

#endif
