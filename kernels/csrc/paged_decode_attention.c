/* Paged decode attention for CPU: one new query row per sequence over its context, K and V read
 * in place from the block pool (no gathered copy, no padding). The pool holds float32, or
 * bfloat16 when built with -DKV_BFLOAT16 (widened to float32 as it is read), or int8 entries
 * when built with -DKV_INT8 (kernels/kv_quant.py: head_dim levels, then their float32 scale; a
 * key's scale multiplies its score, a value's its probability); query, output and all arithmetic
 * are float32.
 *
 * Layouts (all contiguous, row-major):
 *   out, query       [num_seqs, num_heads, head_dim] float32
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, entry_len] kv_t, entry_len = head_dim
 *                    (+ 4 for the scale's bytes of an int8 entry)
 *   block_tables     [num_seqs, max_blocks_per_seq] int32; entries past a sequence's last block are
 *                    never read, so they may hold anything (-1 padding)
 *   context_lens     [num_seqs] int32, cached tokens including the new one
 * Query head j reads kv head j / (num_heads / num_kv_heads).
 *
 * Masking: the new token, at position context_len - 1, sees its last sliding_window positions
 * (every position when sliding_window is 0): its keys run from key_start = max(0, context_len -
 * sliding_window), and nothing before key_start is read, neither cache nor block table. Scores are
 * s = scale * q.k, and logit_softcap c > 0 makes them c * tanh(s / c) (0 leaves them as they are).
 *
 * One work item is one sequence, in three passes over its keys: score every query head against
 * each key, softmax each head's scores, weigh each value. K and V are each read once, block by block
 * and within a block front to back (a token's row holds every kv head), so the reads stream. Items
 * run in parallel under OpenMP.
 *
 * Built with AVX-512, for a head_dim of 16, 32, 64, 80, 96, 128 or 256 and at most 8 query heads
 * per kv head, the two passes are vectorised by hand: scoring takes 16 keys at a time, scores
 * every query head against them (its row in registers) and sums each head's 16 products in one
 * transposing tree; weighing widens each value row once for its kv head's whole group of query
 * heads. Both request the block two places ahead in the sequence's reading order (K, then V),
 * a part at a time between their arithmetic: without that, a core waits on each block's first
 * lines and reads the pool at half its streaming rate. A bfloat16 pool with
 * AVX512-BF16 multiplies query and key pairs in bfloat16 (the query is bfloat16 before the
 * caller widens it, so nothing is rounded) and sums in float32. Only the summation order differs
 * from the portable passes, but for an int8 pool with AVX512-VNNI: its scoring rounds each query
 * row to int16 levels (an error under 2^-16 of the row's largest element) and sums the products
 * with the keys' levels exactly, 32 at a time, in int32.
 *
 * Returns 0; 1 + the index of the first sequence whose context length or block ids are out of
 * range (nothing is written then); or -1 when scratch memory could not be allocated (the output
 * is then incomplete).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "avx512_lanes.h"
#include "bfloat16.h"
#include "exp_poly.h"

#if defined(KV_BFLOAT16)
typedef uint16_t kv_t;
static inline float kv_load(kv_t x) { return bfloat16_to_float(x); }
#elif defined(KV_INT8)
typedef int8_t kv_t;
static inline float kv_load(kv_t x) { return (float)x; }
#else
typedef float kv_t;
static inline float kv_load(kv_t x) { return x; }
#endif

#ifdef KV_INT8
#define SCALE_LEN 4  /* kv_t elements of an entry's float32 scale */
/* The scale of the entry whose levels start at entry. */
static inline float entry_scale(const kv_t *entry, int64_t head_dim) {
    float scale;
    memcpy(&scale, entry + head_dim, sizeof scale);
    return scale;
}
#else
#define SCALE_LEN 0
static inline float entry_scale(const kv_t *entry, int64_t head_dim) { (void)entry, (void)head_dim; return 1.0f; }
#endif

typedef struct {
    int64_t num_heads, num_kv_heads, head_dim, block_size;
} Shape;

/* kv_t elements of one token's K (or V) of one kv head. */
static inline int64_t entry_len(Shape shape) { return shape.head_dim + SCALE_LEN; }

static int64_t first_key(int64_t context_len, int64_t sliding_window) {
    return sliding_window > 0 && context_len > sliding_window ? context_len - sliding_window : 0;
}

static float dot(const float *restrict a, const kv_t *restrict b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) sum += a[i] * kv_load(b[i]);
    return sum;
}

/* One past the last position of start's block, or context_len if that comes first. */
static int64_t block_end(int64_t start, int64_t context_len, int64_t block_size) {
    const int64_t end = (start / block_size + 1) * block_size;
    return end < context_len ? end : context_len;
}

#define PREFETCH_AHEAD 2  /* blocks of a sequence's reading order between a prefetch and its use */

/* A cache line requested ahead of use. GCC deletes a loop of nothing but __builtin_prefetch, so on
 * x86 the instruction is written out. */
static inline void prefetch_line(const char *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*p));
#else
    __builtin_prefetch(p);
#endif
}

/* A sequence is read in one order: its K blocks from key_start's, then its V blocks. This requests
 * part `part` of `parts` of the block PREFETCH_AHEAD places after position start's block of K (or
 * of V when is_value) in that order. */
static inline void prefetch_ahead(const kv_t *k_cache, const kv_t *v_cache, const int32_t *block_table, int64_t key_start,
                                  int64_t context_len, int64_t start, int is_value, Shape shape, int64_t part,
                                  int64_t parts) {
    const int64_t first = key_start / shape.block_size;
    const int64_t count = (context_len + shape.block_size - 1) / shape.block_size - first;
    const int64_t order = start / shape.block_size - first + is_value * count + PREFETCH_AHEAD;
    if (order >= 2 * count) return;
    const int64_t block_len = shape.block_size * shape.num_kv_heads * entry_len(shape);
    const kv_t *block = order < count ? k_cache + block_table[first + order] * block_len
                                      : v_cache + block_table[first + order - count] * block_len;
    const int64_t lines = block_len * (int64_t)sizeof(kv_t) / 64;
    for (int64_t line = part * lines / parts; line < (part + 1) * lines / parts; line++)
        prefetch_line((const char *)block + 64 * line);
}

/* scores[j * num_keys + t - key_start] = the (softcapped) score of query head j against key t, for
 * every query head j and key t in key_start..context_len-1. */
static void score_keys(float *restrict scores, const float *restrict query, const kv_t *restrict k_cache,
                       const int32_t *restrict block_table, int64_t key_start, int64_t context_len, Shape shape,
                       float scale, float logit_softcap) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start;
    for (int64_t start = key_start, end; start < context_len; start = end) {
        const kv_t *key = k_cache + block_table[start / shape.block_size] * block_stride
                          + (start % shape.block_size) * token_stride;
        end = block_end(start, context_len, shape.block_size);
        for (int64_t t = start; t < end; t++, key += token_stride)
            for (int64_t h = 0, j = 0; h < shape.num_kv_heads; h++)
                for (int64_t g = 0; g < group_size; g++, j++) {
                    const kv_t *head_key = key + h * entry_len(shape);
                    const float score = scale * entry_scale(head_key, head_dim) * dot(query + j * head_dim, head_key, head_dim);
                    scores[j * num_keys + t - key_start] =
                        logit_softcap > 0.0f ? logit_softcap * tanhf(score / logit_softcap) : score;
                }
    }
}

/* Each row of scores, in place, becomes its softmax. */
static void softmax_rows(float *restrict scores, int64_t num_rows, int64_t row_len) {
    for (int64_t j = 0; j < num_rows; j++) {
        float *restrict row = scores + j * row_len;
        float max_score = row[0], total = 0.0f;
#pragma omp simd reduction(max : max_score)
        for (int64_t t = 0; t < row_len; t++) max_score = row[t] > max_score ? row[t] : max_score;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < row_len; t++) {
            row[t] = exp_nonpositive(row[t] - max_score);
            total += row[t];
        }
        const float inv_total = 1.0f / total;
#pragma omp simd
        for (int64_t t = 0; t < row_len; t++) row[t] *= inv_total;
    }
}

/* out[j] = sum_t probs[j * num_keys + t - key_start] * v_t for every query head j. */
static void weigh_values(float *restrict out, const float *restrict probs, const kv_t *restrict v_cache,
                         const int32_t *restrict block_table, int64_t key_start, int64_t context_len, Shape shape) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start;
    memset(out, 0, shape.num_heads * head_dim * sizeof(float));
    for (int64_t start = key_start, end; start < context_len; start = end) {
        const kv_t *value = v_cache + block_table[start / shape.block_size] * block_stride
                            + (start % shape.block_size) * token_stride;
        end = block_end(start, context_len, shape.block_size);
        for (int64_t t = start; t < end; t++, value += token_stride)
            for (int64_t h = 0, j = 0; h < shape.num_kv_heads; h++)
                for (int64_t g = 0; g < group_size; g++, j++) {
                    const kv_t *restrict head_value = value + h * entry_len(shape);
                    const float p = probs[j * num_keys + t - key_start] * entry_scale(head_value, head_dim);
                    float *restrict out_row = out + j * head_dim;
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++) out_row[d] += p * kv_load(head_value[d]);
                }
    }
}

#ifdef __AVX512F__
#define MAX_GROUP_X16 8  /* query heads per kv head that the AVX-512 passes take */

/* 16 elements of a K or V row from p, widened to float32. */
static inline __m512 kv_load16(const kv_t *p) {
#if defined(KV_BFLOAT16)
    const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
#elif defined(KV_INT8)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#else
    return _mm512_loadu_ps(p);
#endif
}

#if defined(KV_INT8) && defined(__AVX512VNNI__)
/* Each query row j as int16 levels: query[j] ~= query_scales[j] * levels[j] (an error under 2^-16
 * of the row's largest element). */
static void query_levels(int16_t *restrict levels, float *restrict query_scales, const float *restrict query,
                         Shape shape) {
    for (int64_t j = 0; j < shape.num_heads; j++) {
        const float *q_row = query + j * shape.head_dim;
        float max_abs = 0.0f;
        for (int64_t d = 0; d < shape.head_dim; d++) max_abs = fmaxf(max_abs, fabsf(q_row[d]));
        query_scales[j] = max_abs / 32767.0f;
        const float inverse = max_abs > 0.0f ? 32767.0f / max_abs : 0.0f;
        for (int64_t d = 0; d < shape.head_dim; d++) levels[j * shape.head_dim + d] = (int16_t)lrintf(q_row[d] * inverse);
    }
}
#endif

/* score_keys for head_dim = 16 * chunks; inlined with a constant chunks. Keys are taken 16 at a
 * time, every query head scored against them before the next 16, so K streams front to back in
 * one pass; a head's 16 sums reduce in one transposing tree. */
static inline __attribute__((always_inline)) void score_keys_x16(
    float *restrict scores, const float *restrict query, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, Shape shape, float scale,
    float logit_softcap, const int64_t chunks) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start;
    const __m512 scales = _mm512_set1_ps(scale);
#if defined(KV_INT8) && defined(__AVX512VNNI__)
    int16_t levels[shape.num_heads * head_dim];  /* [num_heads, head_dim] */
    float query_scales[shape.num_heads];
    if (chunks % 2 == 0) query_levels(levels, query_scales, query, shape);
#endif
    for (int64_t start = key_start, end; start < context_len; start = end) {
        end = block_end(start, context_len, shape.block_size);
        const kv_t *block_keys = k_cache + block_table[start / shape.block_size] * block_stride
                                 + (start % shape.block_size) * token_stride;
        for (int64_t t = start; t < end; t += 16) {
            const int64_t n = end - t < 16 ? end - t : 16;
            const kv_t *tile = block_keys + (t - start) * token_stride;  /* n keys, every kv head */
            for (int64_t j = 0; j < shape.num_heads; j++) {
                if (t == start)  /* a block ahead, one part per query head */
                    prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, start, 0, shape, j,
                                   shape.num_heads);
                const kv_t *head_keys = tile + j / group_size * entry_len(shape);
                const float *q_row = query + j * head_dim;
                __m512 sums[16];
#if defined(KV_INT8) && defined(__AVX512VNNI__)
                if (chunks % 2 == 0) {  /* int16 query and int8 key levels, 32 products a vpdpwssd, summed in int32 */
                    __m512i q_pairs[8];
                    for (int64_t c = 0; c < chunks / 2; c++) q_pairs[c] = _mm512_loadu_si512(levels + j * head_dim + 32 * c);
                    float key_scales[16] = {0};
                    for (int64_t i = 0; i < 16; i++) {
                        __m512i dots = _mm512_setzero_si512();
                        if (i < n) {
                            const kv_t *key = head_keys + i * token_stride;
                            key_scales[i] = entry_scale(key, head_dim);
                            for (int64_t c = 0; c < chunks / 2; c++)
                                dots = _mm512_dpwssd_epi32(dots, q_pairs[c], _mm512_cvtepi8_epi16(
                                                                                 _mm256_loadu_si256((const __m256i *)(key + 32 * c))));
                        }
                        sums[i] = _mm512_cvtepi32_ps(dots);
                    }
                    const __m512 key_sums = _mm512_mul_ps(_mm512_loadu_ps(key_scales), sum_lanes16(sums));
                    _mm512_mask_storeu_ps(scores + j * num_keys + t - key_start, (__mmask16)((1u << n) - 1),
                                          _mm512_mul_ps(_mm512_mul_ps(scales, _mm512_set1_ps(query_scales[j])), key_sums));
                    continue;
                }
#endif
#if defined(KV_BFLOAT16) && defined(__AVX512BF16__)
                if (chunks % 2 == 0) {  /* bfloat16 pairs multiplied and summed in float32 */
                    __m512bh q_pairs[8];  /* the query back in bfloat16 (exact: widened from bfloat16 by the caller) */
                    for (int64_t c = 0; c < chunks / 2; c++)
                        q_pairs[c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q_row + 32 * c + 16), _mm512_loadu_ps(q_row + 32 * c));
                    for (int64_t i = 0; i < 16; i++) {
                        sums[i] = _mm512_setzero_ps();
                        if (i >= n) continue;
                        for (int64_t c = 0; c < chunks / 2; c++)
                            sums[i] = _mm512_dpbf16_ps(sums[i], q_pairs[c],
                                                       (__m512bh)_mm512_loadu_si512(head_keys + i * token_stride + 32 * c));
                    }
                    _mm512_mask_storeu_ps(scores + j * num_keys + t - key_start, (__mmask16)((1u << n) - 1),
                                          _mm512_mul_ps(scales, sum_lanes16(sums)));
                    continue;
                }
#endif
                __m512 q[16];
                for (int64_t c = 0; c < chunks; c++) q[c] = _mm512_loadu_ps(q_row + 16 * c);
                float key_scales[16] = {0};  /* each key's entry scale (1 outside an int8 pool) */
                for (int64_t i = 0; i < 16; i++) {
                    sums[i] = _mm512_setzero_ps();
                    if (i >= n) continue;
                    key_scales[i] = entry_scale(head_keys + i * token_stride, head_dim);
                    for (int64_t c = 0; c < chunks; c++)
                        sums[i] = _mm512_fmadd_ps(q[c], kv_load16(head_keys + i * token_stride + 16 * c), sums[i]);
                }
                const __m512 sums16 = _mm512_mul_ps(_mm512_loadu_ps(key_scales), sum_lanes16(sums));
                _mm512_mask_storeu_ps(scores + j * num_keys + t - key_start, (__mmask16)((1u << n) - 1),
                                      _mm512_mul_ps(scales, sums16));
            }
        }
    }
    if (logit_softcap > 0.0f)
        for (int64_t i = 0; i < shape.num_heads * num_keys; i++) scores[i] = logit_softcap * tanhf(scores[i] / logit_softcap);
}

/* weigh_values for head_dim = 16 * chunks: each kv head's value row is widened once per key for
 * every query head of its group, whose output rows accumulate in sums (registers or L1). */
static inline __attribute__((always_inline)) void weigh_values_x16(
    float *restrict out, const float *restrict probs, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, Shape shape, const int64_t chunks) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start;
    for (int64_t h = 0; h < shape.num_kv_heads; h++) {
        const int64_t first = h * group_size;  /* the group's first query head */
        __m512 sums[MAX_GROUP_X16 * 16];  /* [group_size, chunks] */
        for (int64_t i = 0; i < group_size * chunks; i++) sums[i] = _mm512_setzero_ps();
        for (int64_t start = key_start, end; start < context_len; start = end) {
            const kv_t *value = v_cache + block_table[start / shape.block_size] * block_stride
                                + (start % shape.block_size) * token_stride + h * entry_len(shape);
            end = block_end(start, context_len, shape.block_size);
            for (int64_t t = start; t < end; t++, value += token_stride) {
                if (h == 0)  /* a block ahead over the block's keys, on the first kv head's pass */
                    prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, start, 1, shape, t - start,
                                   end - start);
                __m512 row[16];
                for (int64_t c = 0; c < chunks; c++) row[c] = kv_load16(value + 16 * c);
                const float value_scale = entry_scale(value, head_dim);
                for (int64_t g = 0; g < group_size; g++) {
                    const __m512 p = _mm512_set1_ps(probs[(first + g) * num_keys + t - key_start] * value_scale);
                    for (int64_t c = 0; c < chunks; c++) sums[g * chunks + c] = _mm512_fmadd_ps(p, row[c], sums[g * chunks + c]);
                }
            }
        }
        for (int64_t g = 0; g < group_size; g++)
            for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(out + (first + g) * head_dim + 16 * c, sums[g * chunks + c]);
    }
}
#endif

/* One sequence's attention; scores is scratch for [num_heads, context_len - key_start] floats. */
static void attend(float *restrict out, float *restrict scores, const float *restrict query, const kv_t *restrict k_cache,
                   const kv_t *restrict v_cache, const int32_t *restrict block_table, int64_t key_start,
                   int64_t context_len, Shape shape, float scale, float logit_softcap) {
    const int64_t num_keys = context_len - key_start;
#ifdef __AVX512F__
    const int64_t group_size = shape.num_heads / shape.num_kv_heads;
    switch (shape.head_dim % 16 == 0 && group_size <= MAX_GROUP_X16 ? shape.head_dim / 16 : 0) {
#define ATTEND_X16(CHUNKS)                                                                                       \
    case CHUNKS:                                                                                                  \
        score_keys_x16(scores, query, k_cache, v_cache, block_table, key_start, context_len, shape, scale, logit_softcap, \
                       CHUNKS);                                                                                  \
        softmax_rows(scores, shape.num_heads, num_keys);                                                         \
        weigh_values_x16(out, scores, k_cache, v_cache, block_table, key_start, context_len, shape, CHUNKS);              \
        return;
        ATTEND_X16(1) ATTEND_X16(2) ATTEND_X16(4) ATTEND_X16(5) ATTEND_X16(6) ATTEND_X16(8) ATTEND_X16(16)
#undef ATTEND_X16
    }
#endif
    score_keys(scores, query, k_cache, block_table, key_start, context_len, shape, scale, logit_softcap);
    softmax_rows(scores, shape.num_heads, num_keys);
    weigh_values(out, scores, v_cache, block_table, key_start, context_len, shape);
}

static int in_range(const int32_t *block_table, int64_t key_start, int64_t context_len, int64_t num_blocks,
                    int64_t block_size, int64_t max_blocks_per_seq) {
    if (context_len < 1 || context_len > max_blocks_per_seq * block_size) return 0;
    for (int64_t b = key_start / block_size; b < (context_len + block_size - 1) / block_size; b++)
        if (block_table[b] < 0 || block_table[b] >= num_blocks) return 0;
    return 1;
}

int64_t paged_decode_attention(float *out, const float *query, const kv_t *k_cache, const kv_t *v_cache,
                                   const int32_t *block_tables, const int32_t *context_lens, int64_t num_seqs,
                                   int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                                   int64_t block_size, int64_t max_blocks_per_seq, float scale,
                                   int64_t sliding_window, float logit_softcap, int32_t num_threads) {
    int64_t max_keys = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t key_start = first_key(context_lens[s], sliding_window), num_keys = context_lens[s] - key_start;
        if (!in_range(block_tables + s * max_blocks_per_seq, key_start, context_lens[s], num_blocks, block_size,
                      max_blocks_per_seq))
            return s + 1;
        max_keys = num_keys > max_keys ? num_keys : max_keys;
    }
    const Shape shape = {num_heads, num_kv_heads, head_dim, block_size};
    int out_of_memory = 0;

#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        float *scores = malloc(num_heads * max_keys * sizeof(float));  /* [num_heads, num_keys] */
        if (scores == NULL) {
#pragma omp atomic write
            out_of_memory = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < num_seqs; s++) {
            if (scores == NULL) continue;
            const int64_t head_offset = s * num_heads * head_dim;
            attend(out + head_offset, scores, query + head_offset, k_cache, v_cache, block_tables + s * max_blocks_per_seq,
                   first_key(context_lens[s], sliding_window), context_lens[s], shape, scale, logit_softcap);
        }
        free(scores);
    }
    return out_of_memory ? -1 : 0;
}
