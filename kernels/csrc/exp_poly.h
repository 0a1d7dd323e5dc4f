/* e^x by a polynomial, as the compiled CPU kernels' softmaxes and activations take it: x = n ln2 + r
 * with |r| <= ln2 / 2, e^r by a degree-6 polynomial, times 2^n. Relative error ~1e-7. */
#ifndef PDSERVE_EXP_POLY_H
#define PDSERVE_EXP_POLY_H

#include <math.h>
#include <stdint.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* e^x for x <= 0 (a softmax numerator), vectorisable under `omp simd`, 2^n assembled in the
 * exponent bits; inputs below -87 (where e^x turns denormal) give e^-87. */
#pragma omp declare simd
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = floorf(x * 1.44269504089f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const union { int32_t bits; float value; } two_to_n = {.bits = ((int32_t)n + 127) << 23};
    return p * two_to_n.value;
}

#ifdef __AVX512F__
/* e^x lane by lane, 2^n by scalef; inputs are clamped to [-87, 88], where e^x is a normal float32. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#endif
