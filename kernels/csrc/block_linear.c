/* Linear layers on a weight kept in GGUF's block formats, for CPU: the product with float
 * activations reads each block once and unpacks it in registers, never the whole dequantized
 * weight (a decode step then reads 0.56-1.06 bytes a weight instead of bfloat16's 2); and the
 * weight dequantized whole, for the many rows of a prefill (then a float GEMM).
 *
 * Layouts (contiguous, row-major, little-endian):
 *   blocks  [out_features, (in_features / 32) * block_bytes] uint8: each output feature's row of
 *           blocks back to back, as a .gguf file stores a weight. A block holds 32 consecutive
 *           weights of the row; block_type is ggml's type id:
 *             Q8_0 (8)  34 bytes: fp16 d, int8 qs[32]          w[i] = d * qs[i]
 *             Q4_0 (2)  18 bytes: fp16 d, uint8 qs[16]         w[i] = d * ((qs[i] & 15) - 8),
 *                                                              w[i + 16] = d * ((qs[i] >> 4) - 8)
 *             Q4_1 (3)  20 bytes: fp16 d, fp16 m, uint8 qs[16] w[i] = d * (qs[i] & 15) + m,
 *                                                              w[i + 16] = d * (qs[i] >> 4) + m
 *   x       [num_rows, in_features] float32, or bfloat16 (x_is_bfloat16: multiplied in bfloat16
 *           pairs with AVX512-BF16, else widened to float32)
 *   out     block_linear: [num_rows, out_features] float32, out = x . W^T;
 *           block_dequantize: [out_features, in_features] float32, or bfloat16 (out_is_bfloat16)
 *           rounded to nearest even as torch rounds
 *
 * Invariant: every weight is dequantized to the float32 that gguf's numpy code gives, bit for bit:
 * d and m widened exactly; d * q is exact in float32 (11 significant bits times at most 8), so only
 * + m rounds, fused into a multiply-add or not. block_linear then differs from
 * x.float() @ dequantized.T by summation order only, except for bfloat16 x with AVX512-BF16 (below).
 *
 * Numerics with bfloat16 x and AVX512-BF16 (block_linear_rounds_bfloat16_weights() returns 1): the
 * weight is rounded to bfloat16, to nearest even, exactly as block_dequantize's bfloat16 output
 * (the float32 weight above, rounded), and multiplied with x in bfloat16 pairs whose products are
 * exact in float32 and summed in float32 (vdpbf16ps: round to nearest even, no float32 subnormals).
 * The product then equals x.float() @ dequantize(blocks, bfloat16).float().T up to summation order:
 * what a bfloat16 model computes, and what the dequantize-then-GEMM path computes for more rows.
 * (Scaling a block's dot product of exact integer levels by d after it would be more accurate but
 * takes a float32 multiply-add per block, row and feature besides the pair product: as slow as
 * float32.) Without AVX512-BF16 bfloat16 x is widened and multiplied as float32 x is.
 *
 * Invariant: out[r] depends on x[r] and the weight alone, bit for bit: not on num_rows, on where
 * a row falls among them, or on num_threads (every output is summed in one order, whatever tile
 * computes it), so a sequence's logits do not change with the batch it is decoded in.
 *
 * With AVX-512 a block unpacks into two 16-lane vectors: Q8_0's bytes widened, converted and
 * scaled; Q4's nibbles index a 16-entry table of the block's 16 possible weights (d * level, + m:
 * one vector), permuted into place (vpermps reads an index's low 4 bits, so no nibble needs a
 * mask). The product takes a tile of output features by rows at a time (16 features of 1 row, 8 of
 * 2, or 4 of up to 4: 16 accumulators): each block is unpacked once per tile and multiplied into
 * 16-lane accumulators, one per (feature, row), whose 16 sums reduce in one transposing tree.
 * Block scales are widened for a tile's features before its rows pass, and for Q4 the product
 * unpacks nibbles in an order that costs no shuffle, x's blocks permuted to match (a scratch copy,
 * which also widens bfloat16 x). A tile's weight rows stay in L1 while its row tiles pass, so the
 * weight streams from memory once per call; the rows 64 features ahead are requested into L2
 * meanwhile. Output features are split across threads; every thread reads all of x.
 *
 * On the Zen 4 core measured, one row takes about 6 cycles a Q4 block and feature (its shuffle
 * ports are half its multiply-add ports), each further row of a tile about 2 more (two 16-lane
 * multiply-adds): from a few rows on, float32 multiply-adds bound the product.
 *
 * With AVX2 (FMA and F16C too, no AVX-512) a block unpacks an eighth at a time (8 weights, one
 * 8-lane vector) and a tile is 8 features of 1 row, 4 of up to 2, 2 of up to 4 or 1 of up to 8,
 * requesting the rows 64 features ahead as above. On one Zen 3 core SmolLM2's Q8_0 head (49152 x
 * 576) took 2.3-3.0 ms for one row and 15 ms for 16 (bound by float32 multiply-adds).
 *
 * With bfloat16 x and AVX512-BF16 a block unpacks into one vector of 32 bfloat16 weights, and each
 * (feature, row) takes one vdpbf16ps a block (32 multiply-adds into 16 float32 lanes, twice the
 * float32 rate): Q8_0's bytes as above, rounded by vcvtne2ps2bf16; Q4's 16 bytes of nibbles
 * broadcast to the four 128-bit lanes and shifted per lane (vpsrlvw), their low 4 bits indexing the
 * block's 16 weights rounded to bfloat16 (vpermw), in bh_q4_order. x is copied into a scratch
 * buffer [block][row][32] (64-byte aligned, each block of Q4 permuted to match), so a tile's rows
 * are one register's displacements apart; from 8 rows a tile is 2 features by 8 rows (remainders
 * in tiles of 4, 2 and 1), unpacking each block once for 8 rows. Measured hot in L2, a further row
 * costs about 2 cycles a block and feature (half the vdpbf16ps peak; float32 x: about 3).
 *
 * Returns 0, or 1 for arguments it does not take (an unknown block type, in_features not a
 * multiple of 32, a negative size), or 2 when the scratch copy of x could not be allocated;
 * nothing is written then.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include "avx512_lanes.h"
#include "bfloat16.h"
#include "fp16.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };
#define WEIGHTS_PER_BLOCK 32
#define MAX_ACCUMULATORS 16  /* (feature, row) pairs of a tile, one 16-lane accumulator each */
#define MAX_ROWS_PER_TILE 4  /* rows sharing each unpacked block */
#define MAX_BH_ROWS_PER_TILE 8 /* the same with bfloat16 x */
#define CHUNK_BLOCKS 64      /* blocks of a weight row whose scales are widened at a time */
#define PREFETCH_FEATURES 64 /* a tile requests the rows of the features this far past its first */
#define AVX2_ACCUMULATORS 8  /* (feature, row) pairs of a tile without AVX-512, one 8-lane accumulator each */

static int64_t block_bytes(int32_t block_type) {
    switch (block_type) {
        case Q8_0: return 34;
        case Q4_0: return 18;
        case Q4_1: return 20;
        default: return 0;
    }
}

/* The weight of lane i (0..31) of a Q4 block as unpack_for_product orders it: vector i / 16 takes
 * the 8 bytes of qs from byte 8 * (i / 16), lane i % 16 = 2k + j the nibble k of their dword j. */
static inline int64_t q4_product_order(int64_t i) {
    const int64_t lane = i % 16, nibble = lane / 2;
    return 8 * (i / 16) + 4 * (lane % 2) + nibble / 2 + 16 * (nibble % 2);
}

/* A block's 32 weights, as gguf dequantizes them. */
static inline __attribute__((always_inline)) void dequantize_block(const int32_t block_type, const uint8_t *block,
                                                                   float w[WEIGHTS_PER_BLOCK]) {
    const float d = half_at(block);
    if (block_type == Q8_0) {
        for (int i = 0; i < 32; i++) w[i] = (float)(int8_t)block[2 + i] * d;
    } else if (block_type == Q4_0) {
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)((block[2 + i] & 15) - 8);
            w[i + 16] = d * (float)((block[2 + i] >> 4) - 8);
        }
    } else {
        const float m = half_at(block + 2);
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)(block[4 + i] & 15) + m;
            w[i + 16] = d * (float)(block[4 + i] >> 4) + m;
        }
    }
}

#ifdef __AVX512F__
/* A cache line requested into L2 ahead of use (the L1 prefetcher takes it from there: requested
 * into L1 this far ahead, a single core streams a cold weight at two thirds the rate). GCC deletes
 * a loop of nothing but __builtin_prefetch, so on x86 the instruction is written out. */
static inline void prefetch_line(const uint8_t *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* A block's scales widened to float32: d, and m for Q4_1. */
typedef struct {
    float d, m;
} Scales;

static inline __attribute__((always_inline)) Scales scales_of(const int32_t block_type, const uint8_t *block) {
    return (Scales){half_at(block), block_type == Q4_1 ? half_at(block + 2) : 0.0f};
}

/* scales_of in one conversion: d and the next two bytes widened together (for Q4_1 they are m;
 * for the other types m is never read). */
static inline void widen_scales(Scales *scales, const uint8_t *block) {
    int32_t word;
    memcpy(&word, block, sizeof word);
    _mm_storel_pi((__m64 *)scales, _mm_cvtph_ps(_mm_cvtsi32_si128(word)));
}

/* The 16 weights a Q4 block's nibbles stand for, table[q] = d * (q - 8) (Q4_0) or d * q + m (Q4_1). */
static inline __attribute__((always_inline)) __m512 q4_table(const int32_t block_type, const Scales *scales) {
    const __m512 d = _mm512_set1_ps(scales->d);
    if (block_type == Q4_0)
        return _mm512_mul_ps(d, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_add_ps(_mm512_mul_ps(d, levels), _mm512_set1_ps(scales->m));
}

static inline const uint8_t *q4_nibbles(const int32_t block_type, const uint8_t *block) {
    return block + (block_type == Q4_0 ? 2 : 4);
}

/* A block's 32 weights in two vectors, lo = w[0..15] and hi = w[16..31], equal to dequantize_block's. */
static inline __attribute__((always_inline)) void unpack_block(const int32_t block_type, const uint8_t *block,
                                                               const Scales *scales, __m512 *lo, __m512 *hi) {
    if (block_type == Q8_0) {
        const __m512 d = _mm512_set1_ps(scales->d);
        const __m128i q_lo = _mm_loadu_si128((const __m128i *)(block + 2));
        const __m128i q_hi = _mm_loadu_si128((const __m128i *)(block + 18));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q_lo)), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q_hi)), d);
        return;
    }
    const __m512 table = q4_table(block_type, scales);
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q4_nibbles(block_type, block)));
    *lo = _mm512_permutexvar_ps(bytes, table);  /* indexes by bits 3:0, the low nibble */
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

/* unpack_block's weights for the product, Q4's in q4_product_order (x is permuted to match): each
 * 8 bytes of nibbles broadcast (a load) and shifted into place for the table lookup, where
 * widening the 16 bytes takes a shuffle, which competes with the multiply-adds for a port. */
static inline __attribute__((always_inline)) void unpack_for_product(const int32_t block_type, const uint8_t *block,
                                                                     const Scales *scales, __m512 *lo, __m512 *hi) {
    if (block_type == Q8_0) {
        unpack_block(block_type, block, scales, lo, hi);
        return;
    }
    const __m512 table = q4_table(block_type, scales);
    int64_t first, second;
    memcpy(&first, q4_nibbles(block_type, block), sizeof first);
    memcpy(&second, q4_nibbles(block_type, block) + 8, sizeof second);
    const __m512i shifts = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
    *lo = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi64(first), shifts), table);
    *hi = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi64(second), shifts), table);
}

/* acc[r] += block . x[r] for r < rows, the block unpacked once; block then steps to the next
 * feature's (opaquely: else GCC keeps a pointer per feature, more than the registers hold). */
static inline __attribute__((always_inline)) void multiply_block(const int32_t block_type, const int rows, __m512 *acc,
                                                                 const uint8_t **block, int64_t row_bytes,
                                                                 const Scales *scales, const __m512 *x_lo,
                                                                 const __m512 *x_hi) {
    __m512 lo, hi;
    unpack_for_product(block_type, *block, scales, &lo, &hi);
    *block += row_bytes;
    __asm__("" : "+r"(*block));
    for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(hi, x_hi[r], _mm512_fmadd_ps(lo, x_lo[r], acc[r]));
}

#ifdef __AVX512BF16__
/* The weight of word p (0..31) of a Q4 block as multiply_block_bh orders it: nibble p / 8 of the
 * bytes 2 (p % 8) and 2 (p % 8) + 1, low then high. */
static inline int64_t bh_q4_order(int64_t p) {
    const int64_t nibble = p / 8;
    return 2 * (p % 8) + nibble / 2 + 16 * (nibble % 2);
}

/* multiply_block for bfloat16 x: the block's weights rounded to bfloat16 (as block_dequantize
 * rounds them) in one vector, word i the weight of lane i % 16 of unpack_for_product's lo (i < 16)
 * or hi, so each pair of words is a pair of x's in the same (permuted) order; acc[r] += block . x[r]
 * in 16 pair sums. */
static inline __attribute__((always_inline)) void multiply_block_bh(const int32_t block_type, const int rows,
                                                                    __m512 *acc, const uint8_t **block,
                                                                    int64_t row_bytes, const Scales *scales,
                                                                    const __m512bh *x_bh) {
    __m512bh w;
    if (block_type == Q8_0) {
        __m512 lo, hi;
        unpack_block(block_type, *block, scales, &lo, &hi);
        w = _mm512_cvtne2ps_pbh(hi, lo);
    } else {
        /* the 16 bytes of nibbles in each 128-bit lane, lane L's words shifted right 4L bits: word j
         * of lane L then holds nibble L of qs[2j..2j+1] in its low 4 bits (bh_q4_order), which
         * index the block's 16 weights, rounded and repeated in both halves (an index's bit 4 is
         * another nibble's) */
        const __m512 table = q4_table(block_type, scales);
        const __m512i table16 = (__m512i)_mm512_cvtne2ps_pbh(table, table);
        const __m512i shifts = _mm512_setr_epi32(0, 0, 0, 0, 0x40004, 0x40004, 0x40004, 0x40004, 0x80008, 0x80008,
                                                 0x80008, 0x80008, 0xc000c, 0xc000c, 0xc000c, 0xc000c);
        const __m128i bytes = _mm_loadu_si128((const __m128i *)q4_nibbles(block_type, *block));
        const __m512i nibbles = _mm512_broadcast_i32x4(bytes);
        w = (__m512bh)_mm512_permutexvar_epi16(_mm512_srlv_epi16(nibbles, shifts), table16);
    }
    *block += row_bytes;
    __asm__("" : "+r"(*block));
    for (int r = 0; r < rows; r++) acc[r] = _mm512_dpbf16_ps(acc[r], w, x_bh[r]);
}
#endif

/* out[r * out_stride + u] (+)= x[r] . w[u] over num_blocks blocks, for u < features and r < rows
 * (both constants once inlined, features * rows <= MAX_ACCUMULATORS): float32 x's rows x_stride
 * floats apart, bfloat16 x's (bh) blocks x_stride rows of 32 apart ([block][row][32]); weight rows
 * row_bytes apart, block b's scales at scales[b * features + u]. Meanwhile the ahead_lines cache
 * lines from ahead are requested, a share with each block. */
static inline __attribute__((always_inline)) void product_tile(
    const int32_t block_type, const int bh, const int features, const int rows, float *restrict out,
    int64_t out_stride, const void *restrict x, int64_t x_stride, const uint8_t *restrict w, int64_t row_bytes,
    int64_t num_blocks, const Scales *scales, int accumulate, const uint8_t *ahead, int64_t ahead_lines) {
    const int64_t bytes = block_bytes(block_type);
    const int64_t lines_per_block = (ahead_lines + num_blocks - 1) / num_blocks;
    (void)bh;  /* (read only with AVX512-BF16) */
    __m512 acc[MAX_ACCUMULATORS];  /* acc[u * rows + r] */
#pragma GCC unroll 16
    for (int k = 0; k < MAX_ACCUMULATORS; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        for (int64_t line = b * lines_per_block; line < (b + 1) * lines_per_block && line < ahead_lines; line++)
            prefetch_line(ahead + 64 * line);
        const uint8_t *block = w + b * bytes;
        const Scales *block_scales = scales + b * features;
#ifdef __AVX512BF16__
        if (bh) {
            __m512bh x_bh[MAX_BH_ROWS_PER_TILE];
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {
                x_bh[r] = (__m512bh)_mm512_load_si512((const uint16_t *)x + (r + b * x_stride) * WEIGHTS_PER_BLOCK);
                __asm__("" : "+v"(x_bh[r]));  /* in registers, shared by the features */
            }
            if (features == 16) {
#pragma GCC unroll 16
                for (int u = 0; u < features; u++)
                    multiply_block_bh(block_type, rows, acc + u * rows, &block, row_bytes, block_scales + u, x_bh);
            } else {
                for (int u = 0; u < features; u++)
                    multiply_block_bh(block_type, rows, acc + u * rows, &block, row_bytes, block_scales + u, x_bh);
            }
            continue;
        }
#endif
        const float *x32 = x;
        __m512 x_lo[MAX_ROWS_PER_TILE], x_hi[MAX_ROWS_PER_TILE];
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            x_lo[r] = _mm512_loadu_ps(x32 + r * x_stride + b * WEIGHTS_PER_BLOCK);
            x_hi[r] = _mm512_loadu_ps(x32 + r * x_stride + b * WEIGHTS_PER_BLOCK + 16);
            /* in registers, shared by the features: else GCC reloads them into each multiply */
            __asm__("" : "+v"(x_lo[r]), "+v"(x_hi[r]));
        }
        /* 16 features unroll only when told; 8 do better left to GCC (which unrolls 4 itself) */
        if (features == 16) {
#pragma GCC unroll 16
            for (int u = 0; u < features; u++)
                multiply_block(block_type, rows, acc + u * rows, &block, row_bytes, block_scales + u, x_lo, x_hi);
        } else {
            for (int u = 0; u < features; u++)
                multiply_block(block_type, rows, acc + u * rows, &block, row_bytes, block_scales + u, x_lo, x_hi);
        }
    }
    float sums[16];
    _mm512_storeu_ps(sums, sum_lanes16(acc));
    for (int u = 0; u < features; u++)
        for (int r = 0; r < rows; r++)
            out[r * out_stride + u] = (accumulate ? out[r * out_stride + u] : 0.0f) + sums[u * rows + r];
}

/* out[r, u] = x[r] . w[u] for u < features (a constant once inlined) and every row r: the weight
 * rows a chunk of blocks at a time, their scales widened once for all row tiles, of as many rows
 * as the accumulators allow (at most MAX_ROWS_PER_TILE); the first row tile requests the ahead
 * lines, a share with each chunk. */
static inline __attribute__((always_inline)) void product_features(
    const int32_t block_type, const int bh, const int features, float *out, const void *x, const uint8_t *w,
    int64_t num_rows, int64_t out_features, int64_t in_features, int64_t row_bytes, const uint8_t *ahead,
    int64_t ahead_lines) {
    /* float32 x rows in_features apart; bfloat16 x in blocks, [block][row][32] (a tile's rows 64
     * bytes apart, addressed by displacements, not one register each) */
    const int64_t x_bytes = bh ? 2 : 4, x_stride = bh ? num_rows : in_features;
    const int64_t x_row = (bh ? WEIGHTS_PER_BLOCK : in_features) * x_bytes;  /* bytes */
    const int64_t x_block = (bh ? num_rows * WEIGHTS_PER_BLOCK : WEIGHTS_PER_BLOCK) * x_bytes;
    const int max_rows = bh ? MAX_BH_ROWS_PER_TILE : MAX_ROWS_PER_TILE;
    const int tile_rows = MAX_ACCUMULATORS / features < max_rows ? MAX_ACCUMULATORS / features : max_rows;
    const int64_t bytes = block_bytes(block_type), num_blocks = in_features / WEIGHTS_PER_BLOCK;
    Scales scales[CHUNK_BLOCKS * MAX_ACCUMULATORS];  /* [block][feature] */
    for (int64_t first = 0; first < num_blocks; first += CHUNK_BLOCKS) {
        const int64_t count = num_blocks - first < CHUNK_BLOCKS ? num_blocks - first : CHUNK_BLOCKS;
        const uint8_t *chunk = w + first * bytes;
        for (int64_t b = 0; b < count; b++)
            for (int u = 0; u < features; u++)
                widen_scales(&scales[b * features + u], chunk + u * row_bytes + b * bytes);
        const int64_t first_line = first * ahead_lines / num_blocks;
        const uint8_t *chunk_ahead = ahead + 64 * first_line;
        int64_t chunk_lines = (first + count) * ahead_lines / num_blocks - first_line;
        const char *chunk_x = (const char *)x + first * x_block;
        const int accumulate = first > 0;
        int64_t r = 0;
        for (; r + tile_rows <= num_rows; r += tile_rows, chunk_lines = 0)
            product_tile(block_type, bh, features, tile_rows, out + r * out_features, out_features,
                         chunk_x + r * x_row, x_stride, chunk, row_bytes, count, scales, accumulate,
                         chunk_ahead, chunk_lines);
        if (tile_rows > MAX_ROWS_PER_TILE) {  /* the rest in tiles of 4, 2 and 1 rows */
#define TAIL_TILE(n)                                                                                                 \
    if (tile_rows > (n) && num_rows - r >= (n)) {                                                                    \
        product_tile(block_type, bh, features, (n), out + r * out_features, out_features,                            \
                     chunk_x + r * x_row, x_stride, chunk, row_bytes, count, scales, accumulate,   \
                     chunk_ahead, chunk_lines);                                                                      \
        r += (n);                                                                                                    \
        chunk_lines = 0;                                                                                             \
    }
            TAIL_TILE(4) TAIL_TILE(2) TAIL_TILE(1)
#undef TAIL_TILE
            continue;
        }
        float *tail_out = out + r * out_features;
        const char *tail_x = chunk_x + r * x_row;
        const int64_t tail = num_rows - r;  /* < tile_rows */
        if (tile_rows > 1 && tail == 1)
            product_tile(block_type, bh, features, 1, tail_out, out_features, tail_x, x_stride, chunk, row_bytes, count,
                         scales, accumulate, chunk_ahead, chunk_lines);
        if (tile_rows > 2 && tail == 2)
            product_tile(block_type, bh, features, 2, tail_out, out_features, tail_x, x_stride, chunk, row_bytes, count,
                         scales, accumulate, chunk_ahead, chunk_lines);
        if (tile_rows > 3 && tail == 3)
            product_tile(block_type, bh, features, 3, tail_out, out_features, tail_x, x_stride, chunk, row_bytes, count,
                         scales, accumulate, chunk_ahead, chunk_lines);
    }
}

/* out columns [first, first + count) of the product, count <= features (a constant once inlined). */
static inline __attribute__((always_inline)) void product_columns(
    const int32_t block_type, const int bh, const int features, float *out, const void *x, const uint8_t *blocks,
    int64_t num_rows, int64_t out_features, int64_t in_features, int64_t first, int64_t count) {
    const int64_t row_bytes = in_features / WEIGHTS_PER_BLOCK * block_bytes(block_type);
    if (row_bytes == 0) {
        for (int64_t r = 0; r < num_rows; r++)
            for (int64_t n = first; n < first + count; n++) out[r * out_features + n] = 0.0f;
        return;
    }
    /* the rows of the features PREFETCH_FEATURES ahead, as far as the weight goes */
    const int64_t ahead_first = first + PREFETCH_FEATURES;
    const int64_t ahead_count = out_features - ahead_first < features ? out_features - ahead_first : features;
    const uint8_t *ahead = blocks + ahead_first * row_bytes;
    const int64_t ahead_lines = ahead_count > 0 ? (ahead_count * row_bytes + 63) / 64 : 0;
    if (count == features) {
        product_features(block_type, bh, features, out + first, x, blocks + first * row_bytes, num_rows, out_features,
                         in_features, row_bytes, ahead, ahead_lines);
        return;
    }
    for (int64_t n = first; n < first + count; n++)
        product_features(block_type, bh, 1, out + n, x, blocks + n * row_bytes, num_rows, out_features, in_features,
                         row_bytes, ahead, 0);
}

/* Features per tile: one row's 16 accumulators for a single row (a decode step of one sequence),
 * else 8 features by 2 rows or 4 by up to 4; with bfloat16 x (bh) from 8 rows 2 features by 8. */
static int features_per_tile(int64_t num_rows, int bh) {
    if (bh && num_rows >= 8) return 2;
    return num_rows == 1 ? 16 : num_rows == 2 ? 8 : 4;
}

static inline __attribute__((always_inline)) void product_columns_of(
    const int32_t block_type, const int bh, int features, float *out, const void *x, const uint8_t *blocks,
    int64_t num_rows, int64_t out_features, int64_t in_features, int64_t first, int64_t count) {
    if (features == 16)
        product_columns(block_type, bh, 16, out, x, blocks, num_rows, out_features, in_features, first, count);
    else if (features == 8)
        product_columns(block_type, bh, 8, out, x, blocks, num_rows, out_features, in_features, first, count);
    else if (features == 4 || !bh)
        product_columns(block_type, bh, 4, out, x, blocks, num_rows, out_features, in_features, first, count);
    else
        product_columns(block_type, bh, 2, out, x, blocks, num_rows, out_features, in_features, first, count);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* Weights 8j..8j+7 of a block (j < 4, a constant once inlined), equal to dequantize_block's: Q8_0's
 * bytes widened, converted and scaled; Q4's low nibbles of 8 bytes (j < 2) or their high ones. */
static inline __attribute__((always_inline)) __m256 unpack_eighth(const int32_t block_type, const uint8_t *block,
                                                                  const int j, __m256 d, __m256 m) {
    if (block_type == Q8_0) {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(block + 2 + 8 * j));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(block + (block_type == Q4_0 ? 2 : 4) + 8 * (j % 2)));
    const __m256i wide = _mm256_cvtepu8_epi32(bytes);
    const __m256i q = j < 2 ? _mm256_and_si256(wide, _mm256_set1_epi32(15)) : _mm256_srli_epi32(wide, 4);
    if (block_type == Q4_0) return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m);
}

/* The sum of v's 8 lanes, always in the same tree. */
static inline float sum_lanes8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* out[r * out_stride + u] = x[r] . w[u] for u < features and r < rows (constants once inlined,
 * features * rows <= AVX2_ACCUMULATORS), one 8-lane accumulator per (feature, row): each eighth
 * of a block is unpacked once and multiplied with every row, x read from L1 as a memory operand.
 * Each output's lanes add the blocks' eighths in order, whatever the tile. */
static inline __attribute__((always_inline)) void avx2_tile(const int32_t block_type, const int features,
                                                            const int rows, float *out, int64_t out_stride,
                                                            const float *x, int64_t in_features, const uint8_t *w,
                                                            int64_t row_bytes, const uint8_t *ahead,
                                                            int64_t ahead_lines) {
    const int64_t bytes = block_bytes(block_type), num_blocks = in_features / WEIGHTS_PER_BLOCK;
    const int64_t lines_per_block = (ahead_lines + num_blocks - 1) / num_blocks;
    __m256 acc[AVX2_ACCUMULATORS];  /* acc[u * rows + r] */
    for (int k = 0; k < features * rows; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        for (int64_t line = b * lines_per_block; line < (b + 1) * lines_per_block && line < ahead_lines; line++)
            _mm_prefetch((const char *)ahead + 64 * line, _MM_HINT_T1);
        for (int u = 0; u < features; u++) {
            const uint8_t *block = w + u * row_bytes + b * bytes;
            const __m256 d = _mm256_set1_ps(half_at(block));
            const __m256 m = _mm256_set1_ps(block_type == Q4_1 ? half_at(block + 2) : 0.0f);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256 weights = unpack_eighth(block_type, block, j, d, m);
                for (int r = 0; r < rows; r++)
                    acc[u * rows + r] = _mm256_fmadd_ps(
                        weights, _mm256_loadu_ps(x + r * in_features + b * WEIGHTS_PER_BLOCK + 8 * j), acc[u * rows + r]);
            }
        }
    }
    for (int u = 0; u < features; u++)
        for (int r = 0; r < rows; r++) out[r * out_stride + u] = sum_lanes8(acc[u * rows + r]);
}

/* avx2_tile over every row for `features` consecutive features: tiles of as many rows as the
 * accumulators allow, then of 4, 2 and 1; the first requests the ahead_lines cache lines at ahead. */
static inline __attribute__((always_inline)) void avx2_features(const int32_t block_type, const int features,
                                                                float *out, const float *x, const uint8_t *w,
                                                                int64_t num_rows, int64_t out_features,
                                                                int64_t in_features, const uint8_t *ahead,
                                                                int64_t ahead_lines) {
    const int tile_rows = AVX2_ACCUMULATORS / features;
    const int64_t row_bytes = in_features / WEIGHTS_PER_BLOCK * block_bytes(block_type);
    int64_t r = 0;
#define AVX2_TILE(n) avx2_tile(block_type, features, (n), out + r * out_features, out_features, x + r * in_features, \
                               in_features, w, row_bytes, ahead, ahead_lines); ahead_lines = 0
    for (; r + tile_rows <= num_rows; r += tile_rows) { AVX2_TILE(tile_rows); }
    if (tile_rows > 4 && num_rows - r >= 4) { AVX2_TILE(4); r += 4; }
    if (tile_rows > 2 && num_rows - r >= 2) { AVX2_TILE(2); r += 2; }
    if (tile_rows > 1 && num_rows - r >= 1) { AVX2_TILE(1); }
#undef AVX2_TILE
}

/* Features per tile: 8 for one row (a decode step of one sequence), 4 by up to 2 rows, 2 by up
 * to 4, and 1 by 8 from 8 rows (each unpacked eighth of a block then serves 8 rows). */
static int features_per_tile(int64_t num_rows, int bh) {
    (void)bh;
    return num_rows == 1 ? 8 : num_rows < 4 ? 4 : num_rows < 8 ? 2 : 1;
}

/* out columns [first, first + count), count <= features (a tile's features, else one at a time). */
static inline __attribute__((always_inline)) void product_columns_of(
    const int32_t block_type, const int bh, int features, float *out, const void *x, const uint8_t *blocks,
    int64_t num_rows, int64_t out_features, int64_t in_features, int64_t first, int64_t count) {
    (void)bh;  /* always 0: x comes widened */
    const int64_t row_bytes = in_features / WEIGHTS_PER_BLOCK * block_bytes(block_type);
    /* the rows of the features PREFETCH_FEATURES ahead, as far as the weight goes */
    const int64_t ahead_first = first + PREFETCH_FEATURES;
    const int64_t ahead_count = out_features - ahead_first < count ? out_features - ahead_first : count;
    const uint8_t *ahead = blocks + ahead_first * row_bytes;
    const int64_t ahead_lines = ahead_count > 0 ? (ahead_count * row_bytes + 63) / 64 : 0;
#define AVX2_FEATURES(F, n, lines) avx2_features(block_type, (F), out + (n), x, blocks + (n) * row_bytes, num_rows, \
                                                 out_features, in_features, ahead, (lines))
    if (count == features && features == 8)
        AVX2_FEATURES(8, first, ahead_lines);
    else if (count == features && features == 4)
        AVX2_FEATURES(4, first, ahead_lines);
    else if (count == features && features == 2)
        AVX2_FEATURES(2, first, ahead_lines);
    else if (count == features)
        AVX2_FEATURES(1, first, ahead_lines);
    else
        for (int64_t n = first; n < first + count; n++) AVX2_FEATURES(1, n, 0);
#undef AVX2_FEATURES
}
#else
static int features_per_tile(int64_t num_rows, int bh) {
    (void)num_rows, (void)bh;
    return 4;
}

/* out columns [first, first + count): each block dequantized once, then dotted with every row. */
static inline __attribute__((always_inline)) void product_columns_of(
    const int32_t block_type, const int bh, int features, float *out, const void *x, const uint8_t *blocks,
    int64_t num_rows, int64_t out_features, int64_t in_features, int64_t first, int64_t count) {
    (void)features;
    (void)bh;  /* always 0: x comes widened */
    const float *x32 = x;
    const int64_t bytes = block_bytes(block_type), num_blocks = in_features / WEIGHTS_PER_BLOCK;
    for (int64_t n = first; n < first + count; n++) {
        const uint8_t *row = blocks + n * num_blocks * bytes;
        for (int64_t r = 0; r < num_rows; r++) out[r * out_features + n] = 0.0f;
        for (int64_t b = 0; b < num_blocks; b++) {
            float w[WEIGHTS_PER_BLOCK];
            dequantize_block(block_type, row + b * bytes, w);
            for (int64_t r = 0; r < num_rows; r++) {
                const float *xb = x32 + r * in_features + b * WEIGHTS_PER_BLOCK;
                float sum = 0.0f;
                for (int i = 0; i < WEIGHTS_PER_BLOCK; i++) sum += xb[i] * w[i];
                out[r * out_features + n] += sum;
            }
        }
    }
}
#endif

static void product(int32_t block_type, int bh, float *out, const void *x, const uint8_t *blocks, int64_t num_rows,
                    int64_t out_features, int64_t in_features, int32_t num_threads) {
    const int features = features_per_tile(num_rows, bh);
    const int64_t num_tiles = (out_features + features - 1) / features;
    num_threads = num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t t = 0; t < num_tiles; t++) {
        const int64_t first = t * features;
        const int64_t count = out_features - first < features ? out_features - first : features;
#define PRODUCT_COLUMNS(type, bh) \
    product_columns_of(type, bh, features, out, x, blocks, num_rows, out_features, in_features, first, count)
        if (block_type == Q8_0 && bh) PRODUCT_COLUMNS(Q8_0, 1);
        else if (block_type == Q8_0) PRODUCT_COLUMNS(Q8_0, 0);
        else if (block_type == Q4_0 && bh) PRODUCT_COLUMNS(Q4_0, 1);
        else if (block_type == Q4_0) PRODUCT_COLUMNS(Q4_0, 0);
        else if (bh) PRODUCT_COLUMNS(Q4_1, 1);
        else PRODUCT_COLUMNS(Q4_1, 0);
#undef PRODUCT_COLUMNS
    }
}

static int valid(int32_t block_type, int64_t out_features, int64_t in_features) {
    return block_bytes(block_type) != 0 && out_features >= 0 && in_features >= 0
           && in_features % WEIGHTS_PER_BLOCK == 0;
}

/* Element i of x, widened. */
static inline float x_at(const void *x, int64_t i, int32_t x_is_bfloat16) {
    return x_is_bfloat16 ? bfloat16_to_float(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* 1 when block_linear multiplies bfloat16 x by the weight rounded to bfloat16 (AVX512-BF16), 0
 * when by the exact float32 weight. */
int32_t block_linear_rounds_bfloat16_weights(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

int64_t block_linear(float *out, const void *x, const uint8_t *blocks, int32_t block_type, int64_t num_rows,
                     int64_t out_features, int64_t in_features, int32_t x_is_bfloat16, int32_t num_threads) {
    if (!valid(block_type, out_features, in_features) || num_rows < 0) return 1;
#ifdef __AVX512F__
    const int permuted = block_type != Q8_0;  /* Q4 weights unpack in q4_product_order */
#else
    const int permuted = 0;
#endif
    if (!x_is_bfloat16 && !permuted) {
        product(block_type, 0, out, x, blocks, num_rows, out_features, in_features, num_threads);
        return 0;
    }
    const int64_t size = num_rows * in_features;
#ifdef __AVX512BF16__
    if (x_is_bfloat16) {  /* multiplied in bfloat16 pairs: x blocked, each block permuted as its weights unpack */
        const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK;
        /* (64-byte aligned: a block of x a cache line) */
        uint16_t *x16 = aligned_alloc(64, (size_t)(size > 0 ? size : 32) * sizeof(uint16_t));
        if (x16 == NULL) return 2;
        uint16_t order[WEIGHTS_PER_BLOCK];
        for (int64_t i = 0; i < WEIGHTS_PER_BLOCK; i++) order[i] = (uint16_t)(permuted ? bh_q4_order(i) : i);
        const __m512i from = _mm512_loadu_si512(order);
        for (int64_t r = 0; r < num_rows; r++)
            for (int64_t b = 0; b < num_blocks; b++) {
                const __m512i block = _mm512_loadu_si512((const uint16_t *)x + r * in_features + b * WEIGHTS_PER_BLOCK);
                _mm512_store_si512(x16 + (b * num_rows + r) * WEIGHTS_PER_BLOCK, _mm512_permutexvar_epi16(from, block));
            }
        product(block_type, 1, out, x16, blocks, num_rows, out_features, in_features, num_threads);
        free(x16);
        return 0;
    }
#endif
    /* x widened to float32, each block's 32 values in the order its weights unpack */
    float *x32 = malloc((size_t)(size > 0 ? size : 1) * sizeof(float));
    if (x32 == NULL) return 2;
    for (int64_t start = 0; start < size; start += WEIGHTS_PER_BLOCK)
        for (int64_t i = 0; i < WEIGHTS_PER_BLOCK; i++)
            x32[start + i] = x_at(x, start + (permuted ? q4_product_order(i) : i), x_is_bfloat16);
    product(block_type, 0, out, x32, blocks, num_rows, out_features, in_features, num_threads);
    free(x32);
    return 0;
}

/* One weight row of num_blocks blocks dequantized into out_row, float32 or bfloat16. */
static inline __attribute__((always_inline)) void dequantize_row(const int32_t block_type, void *out_row,
                                                                 const uint8_t *row, int64_t num_blocks,
                                                                 int32_t out_is_bfloat16) {
    const int64_t bytes = block_bytes(block_type);
    for (int64_t b = 0; b < num_blocks; b++) {
        const uint8_t *block = row + b * bytes;
#ifdef __AVX512F__
        __m512 lo, hi;
        const Scales scales = scales_of(block_type, block);
        unpack_block(block_type, block, &scales, &lo, &hi);
        if (!out_is_bfloat16) {
            _mm512_storeu_ps((float *)out_row + b * WEIGHTS_PER_BLOCK, lo);
            _mm512_storeu_ps((float *)out_row + b * WEIGHTS_PER_BLOCK + 16, hi);
            continue;
        }
        uint16_t *out16 = (uint16_t *)out_row + b * WEIGHTS_PER_BLOCK;
#ifdef __AVX512BF16__
        /* (no weight is a float32 subnormal, which the instruction would flush: fp16 d and m make
         * every weight a multiple of 2^-24) */
        _mm512_storeu_si512(out16, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
#else
        float w[WEIGHTS_PER_BLOCK];
        _mm512_storeu_ps(w, lo);
        _mm512_storeu_ps(w + 16, hi);
        for (int i = 0; i < WEIGHTS_PER_BLOCK; i++) out16[i] = float_to_bfloat16(w[i]);
#endif
#else
        float w[WEIGHTS_PER_BLOCK];
        dequantize_block(block_type, block, w);
        if (out_is_bfloat16) {
            uint16_t *out16 = (uint16_t *)out_row + b * WEIGHTS_PER_BLOCK;
            for (int i = 0; i < WEIGHTS_PER_BLOCK; i++) out16[i] = float_to_bfloat16(w[i]);
        } else {
            memcpy((float *)out_row + b * WEIGHTS_PER_BLOCK, w, sizeof w);
        }
#endif
    }
}

int64_t block_dequantize(void *out, const uint8_t *blocks, int32_t block_type, int64_t out_features,
                         int64_t in_features, int32_t out_is_bfloat16, int32_t num_threads) {
    if (!valid(block_type, out_features, in_features)) return 1;
    const int64_t num_blocks = in_features / WEIGHTS_PER_BLOCK, row_bytes = num_blocks * block_bytes(block_type);
    const int64_t out_row_bytes = in_features * (out_is_bfloat16 ? 2 : 4);
    num_threads = num_threads > 1 ? num_threads : 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t n = 0; n < out_features; n++) {
        void *out_row = (char *)out + n * out_row_bytes;
        const uint8_t *row = blocks + n * row_bytes;
        switch (block_type) {
            case Q8_0: dequantize_row(Q8_0, out_row, row, num_blocks, out_is_bfloat16); break;
            case Q4_0: dequantize_row(Q4_0, out_row, row, num_blocks, out_is_bfloat16); break;
            default: dequantize_row(Q4_1, out_row, row, num_blocks, out_is_bfloat16); break;
        }
    }
    return 0;
}
