/* Vector helpers the compiled CPU kernels share (AVX-512 only; include after <immintrin.h>). */
#ifndef PDSERVE_AVX512_LANES_H
#define PDSERVE_AVX512_LANES_H

#ifdef __AVX512F__
/* Lane i of the result is the sum of v[i]'s 16 lanes: 16 horizontal sums in one transposing tree. */
static inline __m512 sum_lanes16(const __m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int k = 0; k < 8; k++)  /* per 128-bit lane: v[2k] and v[2k+1], halved */
        pairs[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++)  /* per 128-bit lane: the 4 sums of v[4k..4k+3] over that lane */
        quads[k] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * k], pairs[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(pairs[2 * k], pairs[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                     _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
    const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                      _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}
#endif

#endif
