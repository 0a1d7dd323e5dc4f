/* Linear layers on a Q4_0 or Q4_1 weight repacked for integer dot products, times activations
 * quantized to int8 per block of 32 (llama.cpp's way for a decode step): each output is the sum
 * over its blocks of d * dx * (q . xq) + m * sum(x), the dot product of 32 4-bit levels with 32
 * int8 levels exact in integers, so a block costs its scales and a quarter of an instruction a
 * weight (AVX512-VNNI: vpdpbusd, 64 u8 x s8 products into 16 int32 lanes) instead of unpacking
 * each weight to a float.
 *
 * Layouts (contiguous, little-endian):
 *   packed  [out_features / 16, (in_features / 32) * group_block_bytes] uint8: per group of 16
 *           output features, per block of 32 in-features, group_block_bytes =
 *             fp16 d[16]                    the 16 features' block scales (64 bytes with m)
 *             fp16 m[16]                    Q4_1 only: their block minimums
 *             uint8 qs[4][16][4]            qs[k][f] = bytes 4k..4k+3 of feature f's block qs[16]
 *           so w[f][i] = d[f] * (q - 8) (Q4_0) or d[f] * q + m[f] (Q4_1), q = its nibble as in a
 *           stored block: low nibble of byte i for i < 16, high nibble of byte i - 16 after.
 *   x       [num_rows, in_features] float32, or bfloat16 (x_is_bfloat16)
 *   out     [num_rows, out_features] float32, or bfloat16 with bfloat16 x (summed in float32, then
 *           rounded to nearest even as torch rounds)
 *
 * Activations: for each row and block, amax = max |x|, dx = amax / 127, xq = round(x * (127 /
 * amax)) to nearest even (0 where amax is 0), sx = the float32 sum of the block's x as a fixed
 * tree (tree_sum).
 * Then out[r][n] = sum over blocks b, in order, of fma(m, sx, fma(float(q . xq), d * dx, acc)),
 * Q4_0 taking m = -8 d: x's quantization is the only rounding besides float32's.
 *
 * Invariant: out[r] depends on x[r] and the weight alone, bit for bit: not on num_rows, on where a
 * row falls among them, or on num_threads (each output is summed in the order above), so a
 * sequence's logits do not change with the batch it is decoded in. The portable C computes the
 * same sums; it may round a fused multiply-add differently from the vector code.
 *
 * With AVX512-VNNI a group's block loads its 16 d (and m) as one vector each, and its 256 bytes of
 * nibbles as four vectors, each split into low and high nibbles: 8 vectors whose int32 lane f holds
 * 4 consecutive levels of feature f. Each row's 4 int8 levels of x at the same positions are
 * broadcast to every lane, so 8 vpdpbusd give the block's 16 dot products; a tile of up to 8 rows
 * shares the unpacked block. Groups are split across threads; every thread reads all of x.
 *
 * With AVX2 (FMA and F16C too, no AVX-512) a group's block is taken in two halves of 8 features:
 * vpmaddubsw multiplies the half's levels by a row's broadcast int8 levels and adds pairs into
 * int16, exactly (half_group_tile), and a tile of up to 4 rows shares each unpacked half. On one
 * Zen 3 core (AMD EPYC, AVX2 only) a decode step of SmolLM2-135M's Q4_1 file with int8 activations
 * took 16-19 ms at batch 1 against 76 with the portable C.
 *
 * From MIN_STRIP_ROWS rows (a prefill) the product runs in strips instead: 4 groups (64 features)
 * times 4 rows, so that each broadcast word of x feeds 4 dot products and the 16 sums of a block
 * stay in registers; about 1.3-1.4 times the rate of a bfloat16 GEMM on one core without AMX
 * (2 vpdpbusd a cycle multiply 128 int8 pairs, 2 vdpbf16ps 64 bfloat16 pairs). Threads take
 * (strip, 32 rows) items strip by strip, and quantize the rows first.
 *
 * packed_q4_unpack writes the weight back in its stored layout, [out_features, (in_features / 32) *
 * block_bytes], as a .gguf file holds it: for a prefill's many rows, which dequantize it whole.
 *
 * Both return 0, or 1 for arguments they do not take (a block type other than Q4_0 or Q4_1, in_features
 * not a multiple of 32, out_features not a multiple of 16, a negative size), or 2 when the scratch
 * copy of x could not be allocated; nothing is written then.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include "bfloat16.h"
#include "fp16.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VNNI 1  /* the vector tiles and the strips; else portable C */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define AVX2 1  /* vector tiles of half a group (8 features); else portable C */
#endif

enum { Q4_0 = 2, Q4_1 = 3 };
#define WEIGHTS_PER_BLOCK 32
#define FEATURES_PER_GROUP 16
#define NIBBLE_BYTES 256   /* a group's block of levels: 16 features x 16 bytes */
#define ROWS_PER_TILE 8    /* rows sharing each unpacked block */
#define PREFETCH_GROUPS 4  /* a group requests the group this far ahead of it */
#define STRIP_GROUPS 4     /* groups of a prefill strip: 64 features */
#define STRIP_ROWS 4       /* rows of a prefill strip's tile */
#define STRIP_CHUNK_ROWS 32 /* rows of a thread's work item in a prefill */
#define MIN_STRIP_ROWS 16  /* from this many rows the strips serve */
#define AVX2_ROWS_PER_TILE 4 /* rows sharing each unpacked half block, with AVX2 */

/* Bytes of one group's block: the scales, then the levels. */
static int64_t group_block_bytes(int32_t block_type) {
    switch (block_type) {
        case Q4_0: return 2 * FEATURES_PER_GROUP + NIBBLE_BYTES;
        case Q4_1: return 4 * FEATURES_PER_GROUP + NIBBLE_BYTES;
        default: return 0;
    }
}

#ifdef __AVX512F__
/* 16 bfloat16 values widened to float32 (exact). */
static inline __m512 widened_from_bfloat16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 16 float32 values rounded to bfloat16, to nearest even, as torch rounds (NaN kept quiet). */
static inline __m256i rounded_to_bfloat16(__m512 values) {
    const __m512i bits = _mm512_castps_si512(values);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(values, values, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(rounded);
}
#endif

/* The sum of a block's 32 values as a fixed tree, in float32: lanes i and i + 16 added, then i and
 * i + 8, i + 4, i + 2, i + 1, as the vector code adds its halves. */
static float tree_sum(float *v) {
    for (int width = WEIGHTS_PER_BLOCK / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; i++) v[i] += v[i + width];
    return v[0];
}

/* One row of x quantized per block: levels [num_blocks][32] and scales [num_blocks][2] = (dx, sx). */
static void quantize_row(const void *x, int32_t x_is_bfloat16, int64_t num_blocks, int8_t *levels, float *scales) {
    for (int64_t b = 0; b < num_blocks; b++) {
        const float *block = (const float *)x + b * WEIGHTS_PER_BLOCK;
        const uint16_t *block_bf16 = (const uint16_t *)x + b * WEIGHTS_PER_BLOCK;
        float amax, sum;
#ifdef __AVX512F__
        const __m512 low = x_is_bfloat16 ? widened_from_bfloat16(block_bf16) : _mm512_loadu_ps(block);
        const __m512 high = x_is_bfloat16 ? widened_from_bfloat16(block_bf16 + 16) : _mm512_loadu_ps(block + 16);
        amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
        const __m512 sum16 = _mm512_add_ps(low, high);
        const __m256 sum8 = _mm256_add_ps(_mm512_castps512_ps256(sum16),
                                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum16), 1)));
        const __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(sum8), _mm256_extractf128_ps(sum8, 1));
        const __m128 sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
        sum = _mm_cvtss_f32(_mm_add_ss(sum2, _mm_movehdup_ps(sum2)));
        const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512 scale = _mm512_set1_ps(inverse);  /* products rounded to nearest even by the default mode */
        _mm_storeu_si128((__m128i *)(levels + b * WEIGHTS_PER_BLOCK),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(low, scale))));
        _mm_storeu_si128((__m128i *)(levels + b * WEIGHTS_PER_BLOCK + 16),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(high, scale))));
#else
        float v[WEIGHTS_PER_BLOCK];
        amax = 0.0f;
        for (int i = 0; i < WEIGHTS_PER_BLOCK; i++) {
            v[i] = x_is_bfloat16 ? bfloat16_to_float(block_bf16[i]) : block[i];
            amax = fmaxf(amax, fabsf(v[i]));
        }
        const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < WEIGHTS_PER_BLOCK; i++)
            levels[b * WEIGHTS_PER_BLOCK + i] = (int8_t)nearbyintf(v[i] * inverse);
        sum = tree_sum(v);
#endif
        scales[2 * b] = amax / 127.0f;
        scales[2 * b + 1] = sum;
    }
}

#if defined(VNNI) || defined(AVX2)
/* A cache line requested into L2 ahead of use (as in block_linear.c). */
static inline void prefetch_line(const uint8_t *p) {
    __asm__ volatile("prefetcht1 %0" : : "m"(*p));
}
#endif

#ifdef VNNI
/* Four bytes at p broadcast to every int32 lane, read from memory (not through a general register). */
static inline __m512i broadcast_word(const int8_t *p) {
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

/* out[r][0..15] = the group's 16 features times rows r < rows (a constant once inlined). */
static inline __attribute__((always_inline)) void group_tile(const int32_t block_type, const int rows, float *out,
                                                             int64_t out_stride, const int8_t *levels,
                                                             const float *scales, int64_t in_features,
                                                             const uint8_t *group, int64_t num_blocks,
                                                             const uint8_t *ahead) {
    const int64_t bytes = group_block_bytes(block_type), num_scales = 2 * num_blocks;
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
    __m512 acc[ROWS_PER_TILE];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        const uint8_t *block = group + b * bytes;
        if (ahead != NULL)  /* the same block of the group ahead */
            for (int64_t line = 0; line < bytes; line += 64) prefetch_line(ahead + b * bytes + line);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)block));
        const __m512 m = block_type == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 32)))
                                            : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
        const uint8_t *qs = block + (block_type == Q4_1 ? 64 : 32);
        __m512i q[8];  /* q[k] lane f: levels 4k..4k+3 of feature f; q[4 + k]: levels 16 + 4k.. */
        for (int k = 0; k < 4; k++) {
            const __m512i packed = _mm512_loadu_si512(qs + 64 * k);
            q[k] = _mm512_and_si512(packed, low_nibbles);
            q[4 + k] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
        }
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = levels + r * in_features + b * WEIGHTS_PER_BLOCK;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();  /* two chains */
            for (int j = 0; j < 8; j += 2) {  /* q[j] pairs with x's levels 4j..4j+3 */
                even = _mm512_dpbusd_epi32(even, q[j], broadcast_word(xq + 4 * j));
                odd = _mm512_dpbusd_epi32(odd, q[j + 1], broadcast_word(xq + 4 * j + 4));
            }
            const float *s = scales + r * num_scales + 2 * b;
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(s[1]),
                                     _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(s[0])), acc[r]));
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(out + r * out_stride, acc[r]);
}

/* out[r][16 v + f] = groups v < V (a strip of 16 V features) times rows r < R, for a prefill's
 * many rows: each broadcast word of x feeds V dot products and each unpacked block R rows, where
 * group_tile broadcasts a word for every product. The float sums are updated in group_tile's order,
 * so every output has its bits; out is float32, or bfloat16 (out_is_bfloat16) rounded from them.
 * (The loops are unrolled so that the R x V dot products stay in registers.) */
static inline __attribute__((always_inline)) void strip_tile(const int32_t block_type, const int R, const int V,
                                                             void *out, int32_t out_is_bfloat16,
                                                             int64_t out_stride, const int8_t *levels,
                                                             const float *scales, int64_t in_features,
                                                             const uint8_t *strip, int64_t group_bytes) {
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, bytes = group_block_bytes(block_type);
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
    __m512 sums[STRIP_ROWS][STRIP_GROUPS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) sums[r][v] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        __m512i dots[STRIP_ROWS][STRIP_GROUPS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) dots[r][v] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i low[STRIP_GROUPS], high[STRIP_GROUPS];  /* lane f: levels 4k.. and 16 + 4k.. of feature f */
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) {
                const uint8_t *qs = strip + v * group_bytes + b * bytes + (block_type == Q4_1 ? 64 : 32);
                const __m512i packed = _mm512_loadu_si512(qs + 64 * k);
                low[v] = _mm512_and_si512(packed, low_nibbles);
                high[v] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *xq = levels + r * in_features + b * WEIGHTS_PER_BLOCK + 4 * k;
                const __m512i x_low = broadcast_word(xq), x_high = broadcast_word(xq + 16);
#pragma GCC unroll 4
                for (int v = 0; v < V; v++) {
                    dots[r][v] = _mm512_dpbusd_epi32(dots[r][v], low[v], x_low);
                    dots[r][v] = _mm512_dpbusd_epi32(dots[r][v], high[v], x_high);
                }
            }
        }
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            const uint8_t *block = strip + v * group_bytes + b * bytes;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)block));
            const __m512 m = block_type == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 32)))
                                                : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const float *s = scales + 2 * (r * num_blocks + b);
                const __m512 dot = _mm512_cvtepi32_ps(dots[r][v]);
                sums[r][v] = _mm512_fmadd_ps(m, _mm512_set1_ps(s[1]),
                                             _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(s[0])), sums[r][v]));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            if (out_is_bfloat16)
                _mm256_storeu_si256((__m256i *)((uint16_t *)out + r * out_stride + 16 * v),
                                    rounded_to_bfloat16(sums[r][v]));
            else
                _mm512_storeu_ps((float *)out + r * out_stride + 16 * v, sums[r][v]);
        }
}

/* strip_tile over rows [0, num_rows), in tiles of STRIP_ROWS, 2 and 1 rows, for a strip of
 * num_groups <= STRIP_GROUPS groups. */
static inline __attribute__((always_inline)) void strip_rows(const int32_t block_type, void *out,
                                                             int32_t out_is_bfloat16, int64_t out_features,
                                                             const int8_t *levels, const float *scales,
                                                             int64_t num_rows, int64_t in_features,
                                                             const uint8_t *strip, int64_t group_bytes,
                                                             int num_groups) {
    const int64_t out_bytes = out_is_bfloat16 ? 2 : 4, num_scales = 2 * (in_features / WEIGHTS_PER_BLOCK);
    for (int64_t r = 0; r < num_rows;) {
        const int rows = num_rows - r >= STRIP_ROWS ? STRIP_ROWS : num_rows - r >= 2 ? 2 : 1;
        void *tile_out = (char *)out + r * out_features * out_bytes;
        const int8_t *tile_levels = levels + r * in_features;
        const float *tile_scales = scales + r * num_scales;
#define STRIP_TILE(R, V) strip_tile(block_type, (R), (V), tile_out, out_is_bfloat16, out_features, tile_levels, \
                                    tile_scales, in_features, strip, group_bytes)
#define STRIP_TILES(R)                                                                                  \
        switch (num_groups) {                                                                           \
            case 4: STRIP_TILE(R, 4); break;                                                            \
            case 3: STRIP_TILE(R, 3); break;                                                            \
            case 2: STRIP_TILE(R, 2); break;                                                            \
            default: STRIP_TILE(R, 1);                                                                  \
        }
        if (rows == STRIP_ROWS) {
            STRIP_TILES(STRIP_ROWS)
        } else if (rows == 2) {
            STRIP_TILES(2)
        } else {
            STRIP_TILES(1)
        }
#undef STRIP_TILES
#undef STRIP_TILE
        r += rows;
    }
}

/* The product for num_rows >= MIN_STRIP_ROWS: work items of a strip and up to STRIP_CHUNK_ROWS
 * rows, strip by strip, so that a thread's consecutive items share their weights in cache. */
static void strips_product(const int32_t block_type, void *out, int32_t out_is_bfloat16, const int8_t *levels,
                           const float *scales, const uint8_t *packed, int64_t num_rows, int64_t out_features,
                           int64_t in_features, int32_t num_threads) {
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK;
    const int64_t group_bytes = num_blocks * group_block_bytes(block_type);
    const int64_t num_groups = out_features / FEATURES_PER_GROUP, out_bytes = out_is_bfloat16 ? 2 : 4;
    const int64_t num_strips = (num_groups + STRIP_GROUPS - 1) / STRIP_GROUPS;
    const int64_t num_chunks = (num_rows + STRIP_CHUNK_ROWS - 1) / STRIP_CHUNK_ROWS;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t item = 0; item < num_strips * num_chunks; item++) {
        const int64_t strip = item / num_chunks, first_row = item % num_chunks * STRIP_CHUNK_ROWS;
        const int64_t rows = num_rows - first_row < STRIP_CHUNK_ROWS ? num_rows - first_row : STRIP_CHUNK_ROWS;
        const int groups = (int)(num_groups - strip * STRIP_GROUPS < STRIP_GROUPS ? num_groups - strip * STRIP_GROUPS
                                                                                  : STRIP_GROUPS);
        void *strip_out = (char *)out + (first_row * out_features + strip * STRIP_GROUPS * FEATURES_PER_GROUP) * out_bytes;
        const int8_t *strip_levels = levels + first_row * in_features;
        const float *strip_scales = scales + first_row * 2 * num_blocks;
        const uint8_t *weights = packed + strip * STRIP_GROUPS * group_bytes;
        if (block_type == Q4_1)
            strip_rows(Q4_1, strip_out, out_is_bfloat16, out_features, strip_levels, strip_scales, rows, in_features,
                       weights, group_bytes, groups);
        else
            strip_rows(Q4_0, strip_out, out_is_bfloat16, out_features, strip_levels, strip_scales, rows, in_features,
                       weights, group_bytes, groups);
    }
}

static inline __attribute__((always_inline)) void group_rows(const int32_t block_type, float *out,
                                                             int64_t out_features, const int8_t *levels,
                                                             const float *scales, int64_t num_rows,
                                                             int64_t in_features, const uint8_t *group,
                                                             const uint8_t *ahead) {
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, num_scales = 2 * num_blocks;
    int64_t r = 0;
    for (; r + ROWS_PER_TILE <= num_rows; r += ROWS_PER_TILE, ahead = NULL)
        group_tile(block_type, ROWS_PER_TILE, out + r * out_features, out_features, levels + r * in_features,
                   scales + r * num_scales, in_features, group, num_blocks, ahead);
#define TAIL_TILE(n)                                                                                         \
    if (num_rows - r >= (n)) {                                                                               \
        group_tile(block_type, (n), out + r * out_features, out_features, levels + r * in_features,          \
                   scales + r * num_scales, in_features, group, num_blocks, ahead);                          \
        r += (n);                                                                                            \
        ahead = NULL;                                                                                        \
    }
    TAIL_TILE(4) TAIL_TILE(2) TAIL_TILE(1)
#undef TAIL_TILE
}
#elif defined(AVX2)
/* out[r][0..7] = features 8 half..8 half + 7 of the group times rows r < rows (a constant once
 * inlined). The half's nibbles, 32 bytes of each 64, split into low and high: 8 vectors whose
 * int32 lane f holds 4 consecutive levels of feature f. vpmaddubsw multiplies them by a row's 4
 * int8 levels at the same positions (broadcast to every lane) and adds pairs into int16; the 8
 * vectors' int16 sums are added (16 products of at most 15 * 127 each: at most 30480, exact), and
 * vpmaddwd by ones adds each lane's pair into its int32 dot product. */
static inline __attribute__((always_inline)) void half_group_tile(const int32_t block_type, const int rows,
                                                                  const int half, float *out, int64_t out_stride,
                                                                  const int8_t *levels, const float *scales,
                                                                  int64_t in_features, const uint8_t *group,
                                                                  int64_t num_blocks, const uint8_t *ahead) {
    const int64_t bytes = group_block_bytes(block_type), num_scales = 2 * num_blocks;
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[AVX2_ROWS_PER_TILE];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        const uint8_t *block = group + b * bytes;
        if (ahead != NULL)  /* the same block of the group ahead */
            for (int64_t line = 0; line < bytes; line += 64) prefetch_line(ahead + b * bytes + line);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 16 * half)));
        const __m256 m = block_type == Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 32 + 16 * half)))
                                            : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        const uint8_t *qs = block + (block_type == Q4_1 ? 64 : 32) + 32 * half;
        __m256i q[8];  /* q[k] lane f: levels 4k..4k+3 of feature 8 half + f; q[4 + k]: levels 16 + 4k.. */
        for (int k = 0; k < 4; k++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(qs + 64 * k));
            q[k] = _mm256_and_si256(packed, low_nibbles);
            q[4 + k] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
        }
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = levels + r * in_features + b * WEIGHTS_PER_BLOCK;
            int32_t word;
            __m256i pairs = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {  /* q[j] pairs with x's levels 4j..4j+3 */
                memcpy(&word, xq + 4 * j, sizeof word);
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(q[j], _mm256_set1_epi32(word)));
            }
            const float *s = scales + r * num_scales + 2 * b;
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(s[1]),
                                     _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(s[0])), acc[r]));
        }
    }
    for (int r = 0; r < rows; r++) _mm256_storeu_ps(out + r * out_stride + 8 * half, acc[r]);
}

static inline __attribute__((always_inline)) void group_rows(const int32_t block_type, float *out,
                                                             int64_t out_features, const int8_t *levels,
                                                             const float *scales, int64_t num_rows,
                                                             int64_t in_features, const uint8_t *group,
                                                             const uint8_t *ahead) {
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, num_scales = 2 * num_blocks;
    for (int half = 0; half < 2; half++, ahead = NULL) {
        int64_t r = 0;
#define HALF_TILE(n)                                                                                         \
        half_group_tile(block_type, (n), half, out + r * out_features, out_features, levels + r * in_features, \
                        scales + r * num_scales, in_features, group, num_blocks, ahead);                      \
        r += (n);                                                                                            \
        ahead = NULL;
        while (num_rows - r >= AVX2_ROWS_PER_TILE) { HALF_TILE(AVX2_ROWS_PER_TILE) }
        if (num_rows - r >= 2) { HALF_TILE(2) }
        if (num_rows - r >= 1) { HALF_TILE(1) }
#undef HALF_TILE
    }
}
#else
static inline void group_rows(const int32_t block_type, float *out, int64_t out_features, const int8_t *levels,
                              const float *scales, int64_t num_rows, int64_t in_features, const uint8_t *group,
                              const uint8_t *ahead) {
    (void)ahead;
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, bytes = group_block_bytes(block_type);
    for (int64_t r = 0; r < num_rows; r++)
        for (int f = 0; f < FEATURES_PER_GROUP; f++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < num_blocks; b++) {
                const uint8_t *block = group + b * bytes;
                const float d = half_at(block + 2 * f);
                const float m = block_type == Q4_1 ? half_at(block + 32 + 2 * f) : -8.0f * d;
                const uint8_t *qs = block + (block_type == Q4_1 ? 64 : 32);
                const int8_t *xq = levels + r * in_features + b * WEIGHTS_PER_BLOCK;
                int32_t dot = 0;
                for (int i = 0; i < 16; i++) {
                    const uint8_t byte = qs[64 * (i / 4) + 4 * f + i % 4];
                    dot += (byte & 15) * xq[i] + (byte >> 4) * xq[i + 16];
                }
                const float *s = scales + r * 2 * num_blocks + 2 * b;
                acc = fmaf(m, s[1], fmaf((float)dot, d * s[0], acc));
            }
            out[r * out_features + f] = acc;
        }
}
#endif

/* out[i] = in[i] rounded to bfloat16, to nearest even, as torch rounds (NaN kept quiet). */
static void round_to_bfloat16(uint16_t *out, const float *in, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(out + i), rounded_to_bfloat16(_mm512_loadu_ps(in + i)));
#endif
    for (; i < n; i++) out[i] = float_to_bfloat16(in[i]);
}

int64_t packed_q4_linear(void *out, const void *x, const uint8_t *packed, int32_t block_type, int64_t num_rows,
                         int64_t out_features, int64_t in_features, int32_t x_is_bfloat16, int32_t num_threads) {
    if (group_block_bytes(block_type) == 0 || num_rows < 0 || out_features < 0 || in_features < 0
        || in_features % WEIGHTS_PER_BLOCK || out_features % FEATURES_PER_GROUP)
        return 1;
#ifdef VNNI
    const int strips = num_rows >= MIN_STRIP_ROWS;
#else
    const int strips = 0;
#endif
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK;
    const int64_t group_bytes = num_blocks * group_block_bytes(block_type);
    int8_t *levels = aligned_alloc(64, (size_t)((num_rows * in_features + 63) / 64 * 64 + 64));
    float *scales = malloc((size_t)(2 * num_rows * num_blocks + 1) * sizeof(float));
    /* bfloat16 out is summed into float32 first, but by the strips */
    const int sums_apart = x_is_bfloat16 && !strips;
    float *sums = sums_apart ? malloc((size_t)(num_rows * out_features + 1) * sizeof(float)) : out;
    if (levels == NULL || scales == NULL || sums == NULL) {
        free(levels);
        free(scales);
        if (sums_apart) free(sums);
        return 2;
    }
    num_threads = num_threads > 1 ? num_threads : 1;
    const int64_t x_bytes = x_is_bfloat16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && strips)
    for (int64_t r = 0; r < num_rows; r++)
        quantize_row((const char *)x + r * in_features * x_bytes, x_is_bfloat16, num_blocks,
                     levels + r * in_features, scales + 2 * r * num_blocks);
#ifdef VNNI
    if (strips) {
        strips_product(block_type, out, x_is_bfloat16, levels, scales, packed, num_rows, out_features, in_features,
                       num_threads);
        free(levels);
        free(scales);
        return 0;
    }
#endif
    const int64_t num_groups = out_features / FEATURES_PER_GROUP;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t g = 0; g < num_groups; g++) {
        float *group_out = sums + g * FEATURES_PER_GROUP;
        const uint8_t *group = packed + g * group_bytes;
        const uint8_t *ahead = g + PREFETCH_GROUPS < num_groups ? group + PREFETCH_GROUPS * group_bytes : NULL;
        if (block_type == Q4_1)
            group_rows(Q4_1, group_out, out_features, levels, scales, num_rows, in_features, group, ahead);
        else
            group_rows(Q4_0, group_out, out_features, levels, scales, num_rows, in_features, group, ahead);
    }
    if (sums_apart) {
        round_to_bfloat16(out, sums, num_rows * out_features);
        free(sums);
    }
    free(levels);
    free(scales);
    return 0;
}

/* 1 where this build has the strips (AVX512-VNNI), which serve many rows faster than a GEMM on the
 * dequantized weight (kernels/cpu_packed_q4_linear.py), else 0. */
int64_t packed_q4_strips(void) {
#ifdef VNNI
    return 1;
#else
    return 0;
#endif
}

int64_t packed_q4_unpack(uint8_t *blocks, const uint8_t *packed, int32_t block_type, int64_t out_features,
                         int64_t in_features, int32_t num_threads) {
    if (group_block_bytes(block_type) == 0 || out_features < 0 || in_features < 0
        || in_features % WEIGHTS_PER_BLOCK || out_features % FEATURES_PER_GROUP)
        return 1;
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, group_bytes = group_block_bytes(block_type);
    const int64_t scale_bytes = block_type == Q4_1 ? 4 : 2, block_bytes = scale_bytes + 16;
    const int64_t num_groups = out_features / FEATURES_PER_GROUP;
    num_threads = num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t g = 0; g < num_groups; g++)
        for (int64_t b = 0; b < num_blocks; b++) {
            const uint8_t *from = packed + (g * num_blocks + b) * group_bytes;
            for (int f = 0; f < FEATURES_PER_GROUP; f++) {
                uint8_t *block = blocks + ((g * FEATURES_PER_GROUP + f) * num_blocks + b) * block_bytes;
                for (int64_t s = 0; s < scale_bytes / 2; s++) memcpy(block + 2 * s, from + 32 * s + 2 * f, 2);
                for (int k = 0; k < 4; k++) memcpy(block + scale_bytes + 4 * k,
                           from + FEATURES_PER_GROUP * scale_bytes + 64 * k + 4 * f, 4);
            }
        }
    return 0;
}
