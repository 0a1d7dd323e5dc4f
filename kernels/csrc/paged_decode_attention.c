/* Paged decode attention for CPU: one new query row per sequence over its context, K and V read
 * in place from the block pool (no gathered copy, no padding). The pool holds float32, or
 * bfloat16 when built with -DKV_BFLOAT16 (widened to float32 as it is read), or int8 entries
 * when built with -DKV_INT8 (kernels/kv_quant.py: head_dim levels, then their float32 scale; a
 * key's scale multiplies its score, a value's its probability); query and output are float32 or
 * bfloat16, all arithmetic float32 (a bfloat16 output rounded once, at the end).
 *
 * Layouts (contiguous, row-major, but for query's rows):
 *   out, query       [num_seqs, num_heads, head_dim] float32, or bfloat16 when query_bfloat16; query's
 *                    rows query_stride elements apart (a view into the fused qkv projection will do)
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
 * A sequence's keys are split into parts at every multiple of PART_KEYS positions, each computed
 * alone in three passes over its keys: score every query head against each key, softmax each
 * head's scores, weigh each value. K and V are each read once, block by block and within a block
 * front to back (a token's row holds every kv head), so the reads stream. A sequence of several
 * parts then merges them by each part's share of the softmax's sum. One work item is a run of a
 * sequence's parts, read in order by one thread: the whole sequence, or a share of it where there
 * are fewer sequences than threads, so that one long context keeps every thread busy. Items run in
 * parallel under OpenMP. The parts follow from the sequence alone, so its output is the same bit for
 * bit whatever batch and thread count it runs in.
 *
 * Built with AVX-512, for a head_dim of 16, 32, 64, 80, 96, 128 or 256 and at most 8 query heads
 * per kv head, the two passes are vectorised by hand: scoring takes 16 keys at a time, scores
 * every query head against them (its row in registers) and sums each head's 16 products in one
 * transposing tree; weighing widens each value row once for its kv head's whole group of query
 * heads. Both request the block two places ahead in the run's reading order (K, then V, by part),
 * a slice at a time between their arithmetic: without that, a core waits on each block's first
 * lines and reads the pool at half its streaming rate. A bfloat16 pool with
 * AVX512-BF16 multiplies query and key pairs in bfloat16 (the query is bfloat16 before the
 * caller widens it, so nothing is rounded) and sums in float32. Only the summation order differs
 * from the portable passes, but for an int8 pool with AVX512-VNNI: its scoring rounds each query
 * row to int16 levels (an error under 2^-16 of the row's largest element) and sums the products
 * with the keys' levels exactly, 32 at a time, in int32.
 *
 * Built with AVX2 and FMA but not AVX-512, for a head_dim that is a multiple of 8 (16 to 256, as
 * above) and at most 8 query heads per kv head, the same passes take 8 keys at a time and weigh
 * values in 8-lane slices, 4 or 2 slices of a row a pass so that a group's sums stay in
 * registers, requesting blocks ahead as above. On one Zen 3 core, 16 sequences of 350 tokens
 * over 30 layers (SmolLM2's 9 query and 3 kv heads of 64) took 37.7-39.3 ms against 42.1-43.5
 * for the portable passes.
 *
 * Returns 0; 1 + the index of the first sequence whose context length or block ids are out of
 * range (nothing is written then); or -1 when scratch memory could not be allocated (the output
 * is then incomplete or unwritten).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#if defined(__AVX512F__) || defined(__AVX2__)
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

#define PART_KEYS 64  /* keys of a work item at most (see the header) */
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

/* A run of parts (see paged_decode_attention) is read in one order: a part's K blocks from
 * key_start's, then its V blocks, then the next part's K blocks up to run_end (context_len when the
 * part ends its run). This requests slice `slice` of `slices` of the block PREFETCH_AHEAD places
 * after position start's block of K (or of V when is_value) in that order. */
static inline void prefetch_ahead(const kv_t *k_cache, const kv_t *v_cache, const int32_t *block_table, int64_t key_start,
                                  int64_t context_len, int64_t run_end, int64_t start, int is_value, Shape shape,
                                  int64_t slice, int64_t slices) {
    const int64_t first = key_start / shape.block_size;
    const int64_t count = (context_len + shape.block_size - 1) / shape.block_size - first;
    const int64_t order = start / shape.block_size - first + is_value * count + PREFETCH_AHEAD;
    const int64_t next = context_len / shape.block_size + order - 2 * count;  /* the next part's block */
    if (order >= 2 * count && next >= (run_end + shape.block_size - 1) / shape.block_size) return;
    const int64_t block_len = shape.block_size * shape.num_kv_heads * entry_len(shape);
    const kv_t *block = order < count       ? k_cache + block_table[first + order] * block_len
                        : order < 2 * count ? v_cache + block_table[first + order - count] * block_len
                                            : k_cache + block_table[next] * block_len;
    const int64_t lines = block_len * (int64_t)sizeof(kv_t) / 64;
    for (int64_t line = slice * lines / slices; line < (slice + 1) * lines / slices; line++)
        prefetch_line((const char *)block + 64 * line);
}

/* The first PREFETCH_AHEAD blocks of K from key_start's requested: a run's first, which no
 * prefetch_ahead has requested. */
static void prefetch_first(const kv_t *k_cache, const int32_t *block_table, int64_t key_start, int64_t context_len,
                           Shape shape) {
    const int64_t first = key_start / shape.block_size;
    const int64_t count = (context_len + shape.block_size - 1) / shape.block_size - first;
    const int64_t block_len = shape.block_size * shape.num_kv_heads * entry_len(shape);
    for (int64_t order = 0; order < PREFETCH_AHEAD && order < count; order++)
        for (int64_t line = 0; line < block_len * (int64_t)sizeof(kv_t) / 64; line++)
            prefetch_line((const char *)(k_cache + block_table[first + order] * block_len) + 64 * line);
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

/* Each row of scores, in place, becomes its softmax; row_max[j] and row_total[j] keep row j's
 * largest score and its sum of exp(score - largest), for merging with other parts of the row. */
static void softmax_rows(float *restrict scores, int64_t num_rows, int64_t row_len, float *restrict row_max,
                         float *restrict row_total) {
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
        row_max[j] = max_score, row_total[j] = total;
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

#if defined(__AVX512F__) || defined(__AVX2__)
/* scores[i] = c * tanh(scores[i] / c) for i < n, where c = logit_softcap > 0 (the vector passes
 * score first, then cap). */
static void softcap_in_place(float *scores, int64_t n, float logit_softcap) {
    if (logit_softcap > 0.0f)
        for (int64_t i = 0; i < n; i++) scores[i] = logit_softcap * tanhf(scores[i] / logit_softcap);
}
#endif

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
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, int64_t run_end, Shape shape,
    float scale, float logit_softcap, const int64_t chunks) {
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
                if (t == start)  /* a block ahead, one slice per query head */
                    prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, run_end, start, 0, shape, j,
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
    softcap_in_place(scores, shape.num_heads * num_keys, logit_softcap);
}

/* weigh_values for head_dim = 16 * chunks: each kv head's value row is widened once per key for
 * every query head of its group, whose output rows accumulate in sums (registers or L1). */
static inline __attribute__((always_inline)) void weigh_values_x16(
    float *restrict out, const float *restrict probs, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, int64_t run_end, Shape shape,
    const int64_t chunks) {
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
                    prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, run_end, start, 1, shape, t - start,
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
#elif defined(__AVX2__) && defined(__FMA__)
#define MAX_GROUP_X8 8  /* query heads per kv head that the AVX2 passes take */

/* 8 elements of a K or V row from p, widened to float32. */
static inline __m256 kv_load8(const kv_t *p) {
#if defined(KV_BFLOAT16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#elif defined(KV_INT8)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    return _mm256_loadu_ps(p);
#endif
}

/* Lane i of the result is the sum of v[i]'s 8 lanes: 8 horizontal sums in one tree. */
static inline __m256 sum_lanes8(const __m256 v[8]) {
    /* per 128-bit lane: sums of lane pairs, then of quads, of v[0..3] and v[4..7] */
    const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}

/* score_keys for head_dim = 8 * chunks (score_keys_x16's order, 8 keys at a time); inlined with a
 * constant chunks. */
static inline __attribute__((always_inline)) void score_keys_x8(
    float *restrict scores, const float *restrict query, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, int64_t run_end, Shape shape,
    float scale, float logit_softcap, const int64_t chunks) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start;
    const __m256 scales = _mm256_set1_ps(scale);
    for (int64_t start = key_start, end; start < context_len; start = end) {
        end = block_end(start, context_len, shape.block_size);
        const kv_t *block_keys = k_cache + block_table[start / shape.block_size] * block_stride
                                 + (start % shape.block_size) * token_stride;
        for (int64_t t = start; t < end; t += 8) {
            const int64_t n = end - t < 8 ? end - t : 8;
            const kv_t *tile = block_keys + (t - start) * token_stride;  /* n keys, every kv head */
            for (int64_t j = 0; j < shape.num_heads; j++) {
                if (t == start)  /* a block ahead, one slice per query head */
                    prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, run_end, start, 0, shape, j,
                                   shape.num_heads);
                const kv_t *head_keys = tile + j / group_size * entry_len(shape);
                const float *q_row = query + j * head_dim;
                __m256 sums[8];
                float key_scales[8] = {0};  /* each key's entry scale (1 outside an int8 pool) */
                for (int64_t i = 0; i < 8; i++) {
                    sums[i] = _mm256_setzero_ps();
                    if (i >= n) continue;
                    key_scales[i] = entry_scale(head_keys + i * token_stride, head_dim);
                    for (int64_t c = 0; c < chunks; c++)
                        sums[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q_row + 8 * c),
                                                  kv_load8(head_keys + i * token_stride + 8 * c), sums[i]);
                }
                float tile_scores[8];
                _mm256_storeu_ps(tile_scores, _mm256_mul_ps(scales, _mm256_mul_ps(_mm256_loadu_ps(key_scales),
                                                                                   sum_lanes8(sums))));
                memcpy(scores + j * num_keys + t - key_start, tile_scores, n * sizeof(float));
            }
        }
    }
    softcap_in_place(scores, shape.num_heads * num_keys, logit_softcap);
}

/* weigh_values for head_dim = 8 * chunks, in passes over `width` chunks of each value row (4, or 2
 * where chunks is not a multiple of 4) so that a group's sums stay in registers: each slice of a
 * kv head's value row is widened once per key for every query head of its group. */
static inline __attribute__((always_inline)) void weigh_values_x8(
    float *restrict out, const float *restrict probs, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
    const int32_t *restrict block_table, int64_t key_start, int64_t context_len, int64_t run_end, Shape shape,
    const int64_t chunks) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads, head_dim = shape.head_dim;
    const int64_t token_stride = shape.num_kv_heads * entry_len(shape), block_stride = shape.block_size * token_stride;
    const int64_t num_keys = context_len - key_start, width = chunks % 4 == 0 ? 4 : 2;
    for (int64_t h = 0; h < shape.num_kv_heads; h++) {
        const int64_t first = h * group_size;  /* the group's first query head */
        for (int64_t pass = 0; pass < chunks / width; pass++) {
            __m256 sums[MAX_GROUP_X8 * 4];  /* [group_size, width] */
            for (int64_t i = 0; i < group_size * width; i++) sums[i] = _mm256_setzero_ps();
            for (int64_t start = key_start, end; start < context_len; start = end) {
                const kv_t *value = v_cache + block_table[start / shape.block_size] * block_stride
                                    + (start % shape.block_size) * token_stride + h * entry_len(shape);
                end = block_end(start, context_len, shape.block_size);
                for (int64_t t = start; t < end; t++, value += token_stride) {
                    if (h == 0 && pass == 0)  /* a block ahead over the block's keys, on the first pass */
                        prefetch_ahead(k_cache, v_cache, block_table, key_start, context_len, run_end, start, 1, shape,
                                       t - start, end - start);
                    __m256 row[4];
                    for (int64_t c = 0; c < width; c++) row[c] = kv_load8(value + 8 * (pass * width + c));
                    const float value_scale = entry_scale(value, head_dim);
                    for (int64_t g = 0; g < group_size; g++) {
                        const __m256 p = _mm256_set1_ps(probs[(first + g) * num_keys + t - key_start] * value_scale);
                        for (int64_t c = 0; c < width; c++)
                            sums[g * width + c] = _mm256_fmadd_ps(p, row[c], sums[g * width + c]);
                    }
                }
            }
            for (int64_t g = 0; g < group_size; g++)
                for (int64_t c = 0; c < width; c++)
                    _mm256_storeu_ps(out + (first + g) * head_dim + 8 * (pass * width + c), sums[g * width + c]);
        }
    }
}
#endif

/* One sequence's attention over its keys key_start..context_len-1 alone: out [num_heads, head_dim],
 * and each query head's largest score and sum of exp(score - largest) in row_max, row_total
 * [num_heads]; scores is scratch for [num_heads, context_len - key_start] floats. */
static void attend(float *restrict out, float *restrict row_max, float *restrict row_total, float *restrict scores,
                   const float *restrict query, const kv_t *restrict k_cache, const kv_t *restrict v_cache,
                   const int32_t *restrict block_table, int64_t key_start, int64_t context_len, int64_t run_end,
                   Shape shape, float scale, float logit_softcap) {
    const int64_t num_keys = context_len - key_start;
#ifdef __AVX512F__
    const int64_t group_size = shape.num_heads / shape.num_kv_heads;
    switch (shape.head_dim % 16 == 0 && group_size <= MAX_GROUP_X16 ? shape.head_dim / 16 : 0) {
#define ATTEND_X16(CHUNKS)                                                                                       \
    case CHUNKS:                                                                                                  \
        score_keys_x16(scores, query, k_cache, v_cache, block_table, key_start, context_len, run_end, shape, scale,     \
                       logit_softcap, CHUNKS);                                                                   \
        softmax_rows(scores, shape.num_heads, num_keys, row_max, row_total);                                     \
        weigh_values_x16(out, scores, k_cache, v_cache, block_table, key_start, context_len, run_end, shape, CHUNKS);     \
        return;
        ATTEND_X16(1) ATTEND_X16(2) ATTEND_X16(4) ATTEND_X16(5) ATTEND_X16(6) ATTEND_X16(8) ATTEND_X16(16)
#undef ATTEND_X16
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const int64_t group_size = shape.num_heads / shape.num_kv_heads;
    switch (shape.head_dim % 8 == 0 && group_size <= MAX_GROUP_X8 ? shape.head_dim / 8 : 0) {
#define ATTEND_X8(CHUNKS)                                                                                        \
    case CHUNKS:                                                                                                  \
        score_keys_x8(scores, query, k_cache, v_cache, block_table, key_start, context_len, run_end, shape, scale, \
                      logit_softcap, CHUNKS);                                                                    \
        softmax_rows(scores, shape.num_heads, num_keys, row_max, row_total);                                     \
        weigh_values_x8(out, scores, k_cache, v_cache, block_table, key_start, context_len, run_end, shape, CHUNKS); \
        return;
        ATTEND_X8(2) ATTEND_X8(4) ATTEND_X8(8) ATTEND_X8(10) ATTEND_X8(12) ATTEND_X8(16) ATTEND_X8(32)
#undef ATTEND_X8
    }
#endif
    (void)run_end;  /* the portable passes request nothing ahead */
    score_keys(scores, query, k_cache, block_table, key_start, context_len, shape, scale, logit_softcap);
    softmax_rows(scores, shape.num_heads, num_keys, row_max, row_total);
    weigh_values(out, scores, v_cache, block_table, key_start, context_len, shape);
}

static int in_range(const int32_t *block_table, int64_t key_start, int64_t context_len, int64_t num_blocks,
                    int64_t block_size, int64_t max_blocks_per_seq) {
    if (context_len < 1 || context_len > max_blocks_per_seq * block_size) return 0;
    for (int64_t b = key_start / block_size; b < (context_len + block_size - 1) / block_size; b++)
        if (block_table[b] < 0 || block_table[b] >= num_blocks) return 0;
    return 1;
}

/* A sequence's keys split at multiples of PART_KEYS positions: part p of a sequence whose first
 * key is key_start holds keys max(key_start, (first + p) * PART_KEYS) up to the next multiple, where
 * first = key_start / PART_KEYS. */
static int64_t num_parts(int64_t key_start, int64_t context_len) {
    return (context_len - 1) / PART_KEYS - key_start / PART_KEYS + 1;
}

typedef struct {
    int64_t key_start, key_end;
} Part;

/* Row j of a sequence's merged output from its parts' rows: each part's softmax-weighted mean of
 * values, weighed by its share sum(exp(score - largest of all parts)) of the whole row's. */
static void merge_parts(float *restrict out, const float *restrict partials, int64_t count, Shape shape) {
    const int64_t row_len = shape.num_heads * shape.head_dim, stride = row_len + 2 * shape.num_heads;
    for (int64_t j = 0; j < shape.num_heads; j++) {
        float largest = partials[row_len + j];
        for (int64_t p = 1; p < count; p++) largest = fmaxf(largest, partials[p * stride + row_len + j]);
        float weights[count], total = 0.0f;
        for (int64_t p = 0; p < count; p++) {
            const float *stats = partials + p * stride + row_len;
            weights[p] = stats[shape.num_heads + j] * exp_nonpositive(stats[j] - largest);
            total += weights[p];
        }
        float *restrict out_row = out + j * shape.head_dim;
        memset(out_row, 0, shape.head_dim * sizeof(float));
        for (int64_t p = 0; p < count; p++) {
            const float weight = weights[p] / total, *restrict part_row = partials + p * stride + j * shape.head_dim;
#pragma omp simd
            for (int64_t d = 0; d < shape.head_dim; d++) out_row[d] += weight * part_row[d];
        }
    }
}

/* n floats of row into out, as float32 or (out_bfloat16) bfloat16. */
static void store_row(void *out, const float *row, int64_t n, int out_bfloat16) {
    if (!out_bfloat16) {
        memcpy(out, row, n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = float_to_bfloat16(row[i]);
}

int64_t paged_decode_attention(void *out, const void *query, const kv_t *k_cache, const kv_t *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                               int64_t block_size, int64_t max_blocks_per_seq, float scale, int64_t sliding_window,
                               float logit_softcap, int64_t query_stride, int32_t query_bfloat16, int32_t num_threads) {
    if (num_seqs == 0) return 0;
    int64_t total_parts = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t key_start = first_key(context_lens[s], sliding_window);
        if (!in_range(block_tables + s * max_blocks_per_seq, key_start, context_lens[s], num_blocks, block_size,
                      max_blocks_per_seq))
            return s + 1;
        total_parts += num_parts(key_start, context_lens[s]);
    }
    const Shape shape = {num_heads, num_kv_heads, head_dim, block_size};
    const int64_t row_len = num_heads * head_dim, partial_len = row_len + 2 * num_heads;
    Part *parts = malloc(total_parts * sizeof(Part));
    int64_t *first_part = malloc((num_seqs + 1) * sizeof(int64_t));  /* sequence s owns parts first_part[s].. */
    float *partials = malloc(total_parts * partial_len * sizeof(float));  /* [total_parts, partial_len] */
    if (parts == NULL || first_part == NULL || partials == NULL) {
        free(parts), free(first_part), free(partials);
        return -1;
    }
    for (int64_t s = 0, p = 0; s < num_seqs; s++) {
        const int64_t key_start = first_key(context_lens[s], sliding_window);
        first_part[s] = p;
        for (int64_t start = key_start; start < context_lens[s]; p++) {
            const int64_t end = (start / PART_KEYS + 1) * PART_KEYS;
            parts[p] = (Part){start, end < context_lens[s] ? end : context_lens[s]};
            start = parts[p].key_end;
        }
        first_part[s + 1] = p;
    }
    /* A run is a sequence's parts first_part[s] + r * count / runs up to the next run's, computed
     * in order by one thread: each sequence in one run, unless there are fewer sequences than
     * threads. Only a run's first blocks are requested here; prefetch_ahead reads across its seams. */
    const int64_t runs = (num_threads + num_seqs - 1) / num_seqs;
    const int64_t in_size = query_bfloat16 ? 2 : 4;
    int out_of_memory = 0;

#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        /* [num_heads, PART_KEYS] scores, then the query widened [num_heads, head_dim], then one row's output */
        float *scratch = malloc((num_heads * PART_KEYS + 2 * row_len) * sizeof(float));
        if (scratch == NULL) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        float *query_row = scratch + num_heads * PART_KEYS, *out_row = query_row + row_len;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_seqs * runs; item++) {
            const int64_t s = item / runs, r = item % runs, count = first_part[s + 1] - first_part[s];
            const int64_t begin = first_part[s] + r * count / runs, end = first_part[s] + (r + 1) * count / runs;
            if (scratch == NULL || begin == end) continue;
            const int32_t *block_table = block_tables + s * max_blocks_per_seq;
            const char *seq_query = (const char *)query + s * query_stride * in_size;
            if (query_bfloat16)
                for (int64_t i = 0; i < row_len; i++) query_row[i] = bfloat16_to_float(((const uint16_t *)seq_query)[i]);
            prefetch_first(k_cache, block_table, parts[begin].key_start, parts[begin].key_end, shape);
            for (int64_t p = begin; p < end; p++) {
                float *partial = partials + p * partial_len;
                attend(partial, partial + row_len, partial + row_len + num_heads, scratch,
                       query_bfloat16 ? query_row : (const float *)seq_query, k_cache, v_cache, block_table,
                       parts[p].key_start, parts[p].key_end, parts[end - 1].key_end, shape, scale, logit_softcap);
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < num_seqs; s++) {
            if (scratch == NULL) continue;
            const int64_t count = first_part[s + 1] - first_part[s];
            const float *seq_partials = partials + first_part[s] * partial_len;
            if (count > 1) merge_parts(out_row, seq_partials, count, shape);
            store_row((char *)out + s * row_len * in_size, count > 1 ? out_row : seq_partials, row_len,
                      query_bfloat16);
        }
        free(scratch);
    }
    free(parts), free(first_part), free(partials);
    return out_of_memory ? -1 : 0;
}
