/* Linear layers on a weight kept in GGUF's K-quant formats Q4_K and Q6_K, for CPU: the product
 * with float activations unpacks each super-block of 256 weights once into a float32 buffer that
 * stays in L1 and multiplies it with every row of x, so the weight is read once per call (4.5 or
 * 6.6 bits a weight where bfloat16 takes 16); and the weight dequantized whole, for the many rows of
 * a prefill (then a float GEMM).
 *
 * Layouts (contiguous, row-major, little-endian; kernels/kquant_reference.py draws the bits):
 *   blocks  [out_features, (in_features / 256) * block_bytes] uint8: each output feature's
 *           super-blocks back to back, as a .gguf file stores a weight; block_type is ggml's id:
 *             Q4_K (12) 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins for 8
 *                       sub-blocks of 32, 128 bytes of nibbles   w = (d * sc) * q - dmin * m
 *             Q6_K (14) 210 bytes: 128 bytes of low nibbles, 64 of high bit pairs, int8 scales
 *                       for 16 sub-blocks of 16, fp16 d           w = (d * sc) * (q - 32)
 *   x       [num_rows, in_features] float32, or bfloat16 (x_is_bfloat16)
 *   out     kquant_linear: [num_rows, out_features] float32, out = x . W^T;
 *           kquant_dequantize: [out_features, in_features] float32, or bfloat16 (out_is_bfloat16)
 *           rounded to nearest even as torch rounds
 *
 * Invariant: every weight is dequantized to the float32 that gguf's numpy code gives, bit for bit
 * (its products are exact in float32, so only Q4_K's subtraction rounds, fused or not).
 * kquant_linear then differs from x.float() @ dequantized.T by summation order only, except for
 * bfloat16 x with AVX512-BF16 (kquant_linear_rounds_bfloat16_weights() returns 1): then the weight is
 * rounded to bfloat16, to nearest even, as kquant_dequantize's bfloat16 output, and multiplied with
 * x in bfloat16 pairs summed in float32 (vdpbf16ps): the product equals
 * x.float() @ dequantize(blocks, bfloat16).float().T up to summation order, what a bfloat16 model
 * computes. (No weight is a float32 subnormal, which the instruction would flush: every weight is a
 * multiple of fp16's least step, 2^-24.) Without AVX512-BF16, bfloat16 x is widened to float32.
 *
 * Invariant: out[r] depends on x[r] and the weight alone, bit for bit: each row sums its products
 * in one order (super-block by super-block, into the same accumulators) whatever num_rows,
 * wherever the row falls among them, and whatever num_threads (threads split output features).
 *
 * Loop order: a thread takes output features; for each, rows pass ROWS_PER_PASS at a time, and
 * for each super-block of the feature's weight row the 256 weights are unpacked (and, for
 * bfloat16 pairs, rounded) into a buffer, then multiplied into each row's accumulators (with
 * AVX-512, four 16-lane float32 vectors a row, reduced once at the end). A feature's weight row
 * stays in L1 or L2 while further passes of rows re-read it. With AVX-512 a super-block unpacks
 * 16 weights an instruction sequence (bytes widened, shifted and masked to their levels, converted,
 * scaled); on one core of an AMD EPYC (Zen 4), hot in cache, bfloat16 x, [3072 x 1024]: Q4_K 0.41
 * ms for 1 row and 0.80 for 8, Q6_K 0.52 and 0.93, where F.linear on the weight in bfloat16 takes
 * 0.26 and 0.45 (it reads 3.6 and 2.4 times the bytes, which a decode step's cold weights charge).
 *
 * Returns 0, or 1 for arguments it does not take (an unknown block type, in_features not a
 * multiple of 256, a negative size), or 2 when a scratch copy of x could not be allocated;
 * nothing is written then.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include "bfloat16.h"
#include "fp16.h"

enum { Q4_K = 12, Q6_K = 14 };
#define WEIGHTS_PER_SUPER_BLOCK 256
#define ROWS_PER_PASS 16 /* rows multiplied with each unpacked super-block before the next one */

static int64_t super_block_bytes(int32_t block_type) {
    switch (block_type) {
        case Q4_K: return 144;
        case Q6_K: return 210;
        default: return 0;
    }
}

/* A Q4_K super-block's 256 weights: sub-block j's 32 are the low (j even) or high nibbles of
 * qs[32 (j / 2) ..], scaled by its 6-bit scale and offset by its 6-bit min. */
static void unpack_q4_k(const uint8_t *block, float *w) {
    const float d = half_at(block), dmin = half_at(block + 2);
    const uint8_t *scales = block + 4, *qs = block + 16;
    for (int j = 0; j < 8; j++) {
        const int sc = j < 4 ? scales[j] & 63 : (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
        const int m = j < 4 ? scales[j + 4] & 63 : (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        const float scale = d * (float)sc, offset = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
#ifdef __AVX512F__
        for (int i = 0; i < 32; i += 16) {
            const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + i)));
            const __m512i levels = _mm512_and_si512(_mm512_srli_epi32(bytes, shift), _mm512_set1_epi32(15));
            _mm512_storeu_ps(w + 32 * j + i, _mm512_fmsub_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(levels),
                                                             _mm512_set1_ps(offset)));
        }
#else
        for (int i = 0; i < 32; i++) w[32 * j + i] = scale * (float)((q[i] >> shift) & 15) - offset;
#endif
    }
}

/* A Q6_K super-block's 256 weights: weight 128 h + 32 t + i takes nibble t / 2 of
 * ql[64 h + 32 (t % 2) + i] and bits 2t, 2t + 1 of qh[32 h + i]; each 16 their int8 scale. */
static void unpack_q6_k(const uint8_t *block, float *w) {
    const uint8_t *ql = block, *qh = block + 128;
    const int8_t *scales = (const int8_t *)(block + 192);
    const float d = half_at(block + 208);
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++) {
            const uint8_t *low = ql + 64 * h + 32 * (t % 2), *high = qh + 32 * h;
            float *out = w + 128 * h + 32 * t;
            for (int half = 0; half < 2; half++) {
                const float scale = d * (float)scales[(128 * h + 32 * t) / 16 + half];
#ifdef __AVX512F__
                const int i = 16 * half;
                const __m512i low4 = _mm512_and_si512(
                    _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(low + i))), 4 * (t / 2)),
                    _mm512_set1_epi32(15));
                const __m512i high2 = _mm512_and_si512(
                    _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(high + i))), 2 * t),
                    _mm512_set1_epi32(3));
                const __m512i q = _mm512_sub_epi32(_mm512_or_si512(low4, _mm512_slli_epi32(high2, 4)),
                                                   _mm512_set1_epi32(32));
                _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(q)));
#else
                for (int i = 16 * half; i < 16 * half + 16; i++) {
                    const int q = ((low[i] >> (4 * (t / 2))) & 15) | (((high[i] >> (2 * t)) & 3) << 4);
                    out[i] = scale * (float)(q - 32);
                }
#endif
            }
        }
}

static inline void unpack_super_block(int32_t block_type, const uint8_t *block, float *w) {
    if (block_type == Q4_K) unpack_q4_k(block, w);
    else unpack_q6_k(block, w);
}

/* One row's running sums: four 16-lane vectors with AVX-512, else one float. */
typedef struct {
#ifdef __AVX512F__
    __m512 lanes[4];
#else
    float sum;
#endif
} Accumulator;

static inline void clear(Accumulator *acc) { memset(acc, 0, sizeof *acc); }

/* acc += w . x over one super-block, float32. */
static inline void accumulate(Accumulator *acc, const float *w, const float *x) {
#ifdef __AVX512F__
    for (int v = 0; v < WEIGHTS_PER_SUPER_BLOCK; v += 64)
        for (int k = 0; k < 4; k++)
            acc->lanes[k] = _mm512_fmadd_ps(_mm512_load_ps(w + v + 16 * k), _mm512_loadu_ps(x + v + 16 * k),
                                            acc->lanes[k]);
#else
    float sum = 0.0f;
    for (int i = 0; i < WEIGHTS_PER_SUPER_BLOCK; i++) sum += w[i] * x[i];
    acc->sum += sum;
#endif
}

#ifdef __AVX512BF16__
/* acc += w . x over one super-block in bfloat16 pairs: w16 the weights rounded, x bfloat16. */
static inline void accumulate_bh(Accumulator *acc, const __m512bh *w16, const uint16_t *x) {
    for (int v = 0; v < 8; v++)
        acc->lanes[v % 4] = _mm512_dpbf16_ps(acc->lanes[v % 4], w16[v], (__m512bh)_mm512_loadu_si512(x + 32 * v));
}
#endif

static inline float total(const Accumulator *acc) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc->lanes[0], acc->lanes[1]),
                                              _mm512_add_ps(acc->lanes[2], acc->lanes[3])));
#else
    return acc->sum;
#endif
}

/* out[r * out_features] for every row r: the product of x with one feature's weight row. x is
 * float32, or bfloat16 when bh (built with AVX512-BF16 only). */
static void product_feature(int32_t block_type, int bh, float *out, const void *x, const uint8_t *row,
                            int64_t num_rows, int64_t out_features, int64_t in_features) {
    const int64_t bytes = super_block_bytes(block_type), num_super_blocks = in_features / WEIGHTS_PER_SUPER_BLOCK;
    float w[WEIGHTS_PER_SUPER_BLOCK] __attribute__((aligned(64)));
    Accumulator acc[ROWS_PER_PASS];
    for (int64_t first = 0; first < num_rows; first += ROWS_PER_PASS) {
        const int64_t rows = num_rows - first < ROWS_PER_PASS ? num_rows - first : ROWS_PER_PASS;
        for (int64_t r = 0; r < rows; r++) clear(&acc[r]);
        for (int64_t b = 0; b < num_super_blocks; b++) {
            unpack_super_block(block_type, row + b * bytes, w);
            const int64_t offset = (first * in_features) + b * WEIGHTS_PER_SUPER_BLOCK;  /* x's element */
#ifdef __AVX512BF16__
            if (bh) {
                __m512bh w16[8];
                for (int v = 0; v < 8; v++)
                    w16[v] = _mm512_cvtne2ps_pbh(_mm512_load_ps(w + 32 * v + 16), _mm512_load_ps(w + 32 * v));
                for (int64_t r = 0; r < rows; r++)
                    accumulate_bh(&acc[r], w16, (const uint16_t *)x + offset + r * in_features);
                continue;
            }
#endif
            for (int64_t r = 0; r < rows; r++) accumulate(&acc[r], w, (const float *)x + offset + r * in_features);
        }
        for (int64_t r = 0; r < rows; r++) out[(first + r) * out_features] = total(&acc[r]);
    }
    (void)bh;
}

static int valid(int32_t block_type, int64_t out_features, int64_t in_features) {
    return super_block_bytes(block_type) != 0 && out_features >= 0 && in_features >= 0
           && in_features % WEIGHTS_PER_SUPER_BLOCK == 0;
}

/* 1 when kquant_linear multiplies bfloat16 x by the weight rounded to bfloat16 (AVX512-BF16), 0
 * when by the exact float32 weight. */
int32_t kquant_linear_rounds_bfloat16_weights(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

int64_t kquant_linear(float *out, const void *x, const uint8_t *blocks, int32_t block_type, int64_t num_rows,
                      int64_t out_features, int64_t in_features, int32_t x_is_bfloat16, int32_t num_threads) {
    if (!valid(block_type, out_features, in_features) || num_rows < 0) return 1;
    const int bh = x_is_bfloat16 && kquant_linear_rounds_bfloat16_weights();
    float *widened = NULL;  /* bfloat16 x as float32, where pairs cannot be multiplied */
    if (x_is_bfloat16 && !bh) {
        const int64_t size = num_rows * in_features;
        widened = malloc((size_t)(size > 0 ? size : 1) * sizeof(float));
        if (widened == NULL) return 2;
        for (int64_t i = 0; i < size; i++) widened[i] = bfloat16_to_float(((const uint16_t *)x)[i]);
        x = widened;
    }
    const int64_t row_bytes = in_features / WEIGHTS_PER_SUPER_BLOCK * super_block_bytes(block_type);
    num_threads = num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t n = 0; n < out_features; n++)
        product_feature(block_type, bh, out + n, x, blocks + n * row_bytes, num_rows, out_features, in_features);
    free(widened);
    return 0;
}

int64_t kquant_dequantize(void *out, const uint8_t *blocks, int32_t block_type, int64_t out_features,
                          int64_t in_features, int32_t out_is_bfloat16, int32_t num_threads) {
    if (!valid(block_type, out_features, in_features)) return 1;
    const int64_t bytes = super_block_bytes(block_type), num_super_blocks = in_features / WEIGHTS_PER_SUPER_BLOCK;
    num_threads = num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t n = 0; n < out_features; n++) {
        for (int64_t b = 0; b < num_super_blocks; b++) {
            const int64_t first = n * in_features + b * WEIGHTS_PER_SUPER_BLOCK;  /* out's element */
            const uint8_t *block = blocks + (n * num_super_blocks + b) * bytes;
            if (!out_is_bfloat16) {
                unpack_super_block(block_type, block, (float *)out + first);
                continue;
            }
            float w[WEIGHTS_PER_SUPER_BLOCK] __attribute__((aligned(64)));
            unpack_super_block(block_type, block, w);
            uint16_t *out16 = (uint16_t *)out + first;
#ifdef __AVX512BF16__
            for (int v = 0; v < 8; v++)
                _mm512_storeu_si512(out16 + 32 * v, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(w + 32 * v + 16),
                                                                                 _mm512_load_ps(w + 32 * v)));
#else
            for (int i = 0; i < WEIGHTS_PER_SUPER_BLOCK; i++) out16[i] = float_to_bfloat16(w[i]);
#endif
        }
    }
    return 0;
}
