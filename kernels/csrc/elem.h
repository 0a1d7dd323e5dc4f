/* A tensor's element as the compiled CPU kernels read and write it: float32, or bfloat16 when
 * the including source is built with -DBFLOAT16; arithmetic is always float32. */
#ifndef PDSERVE_ELEM_H
#define PDSERVE_ELEM_H

#include <stdint.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "bfloat16.h"

#ifdef BFLOAT16
typedef uint16_t elem_t;
static inline float load(elem_t x) { return bfloat16_to_float(x); }
static inline elem_t store(float x) { return float_to_bfloat16(x); }
#else
typedef float elem_t;
static inline float load(elem_t x) { return x; }
static inline elem_t store(float x) { return x; }
#endif

#ifdef __AVX512F__
/* 16 elements widened to float32. */
static inline __m512 load16(const elem_t *p) {
#ifdef BFLOAT16
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#else
    return _mm512_loadu_ps(p);
#endif
}
#endif

#endif
