/* Paged prefill attention for CPU: each sequence's new tokens attend causally over its cached
 * prefix and each other, K and V read from the block pool. Query, pool and output are float32, or
 * bfloat16 when built with -DBFLOAT16 (elem.h); the arithmetic is float32.
 *
 * Layouts (all contiguous, row-major, elem_t unless said):
 *   out, query       [num_tokens, num_heads, head_dim], sequences back to back
 *   k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables     [num_seqs, max_blocks_per_seq] int32; entries of blocks outside what a
 *                    sequence's new tokens see are never read, so they may hold anything (-1)
 *   query_start_loc  [num_seqs + 1] int32, sequence s's new tokens are rows
 *                    query_start_loc[s]..query_start_loc[s + 1] - 1
 *   context_lens     [num_seqs] int32, cached prefix + new tokens
 * Query head j reads kv head j / (num_heads / num_kv_heads); head_dim is a multiple of 16.
 *
 * Masking: new token i of a sequence of query_len new tokens sits at position p = context_len -
 * query_len + i and sees keys max(0, p - sliding_window + 1)..p (0..p when sliding_window is 0).
 * Cache slots outside that are never read into the output, even NaN.
 *
 * Method, flash attention in two passes:
 * 1. per (sequence, kv head), the keys its new tokens see are copied out of the pool into tiles of
 *    16 keys (keys past the context zero): a K tile as [lanes][16], a lane one key's dim in float32
 *    or, in bfloat16, two adjacent dims in 32 bits; a V tile as [16][head_dim], in float32;
 * 2. per (sequence, kv head, QUERY_ROWS new tokens), every query head of the group runs an online
 *    softmax over the tiles its rows see: a tile's 16 scores, their running max and sum, and the
 *    output row rescaled and added the tile's probabilities times its values, all in float32 as
 *    the decode kernel computes; the output row is divided by the sum (and rounded to bfloat16) at
 *    the end.
 * A K tile's layout makes 16 keys' scores one fused multiply-add per lane against the query's lane
 * broadcast, with no horizontal sums (vfmadd231ps, or vdpbf16ps for bfloat16 pairs). Built with
 * AVX-512 (and AVX512-BF16 for bfloat16), QUERY_BLOCK query rows at a time share each tile row
 * read; else portable C does the same arithmetic (bfloat16 products are exact in float32) up to
 * summation order. Tiles start at multiples of 16 positions, so a row's result does not depend on
 * how its prompt was chunked. Both passes run their items in parallel under OpenMP.
 *
 * The probabilities meet V in float32. Rounding them to bfloat16 first, as flash attention does on
 * GPUs, made this kernel 15-19 % faster on SmolLM2's shape (V tiles of bfloat16 pairs, vdpbf16ps),
 * but moved its output far enough from the decode kernel's that a request recomputed after
 * preemption or migration sampled other tokens (tests/engine/test_engine_sampling.py).
 *
 * Returns 0; 1 + the index of the first sequence whose lengths or block ids are out of range
 * (nothing is written then); or -1 when scratch memory could not be allocated (nothing is written).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "elem.h"
#include "exp_poly.h"

#ifdef BFLOAT16
typedef uint32_t lane_t;  /* two adjacent dims of one row, bfloat16, the first in the low half */
#define DIMS_PER_LANE 2
#else
typedef float lane_t;
#define DIMS_PER_LANE 1
#endif
#if defined(__AVX512F__) && (defined(__AVX512BF16__) || !defined(BFLOAT16))
#define VECTORISED 1
#endif

#define TILE_KEYS 16
#define QUERY_ROWS 16  /* new tokens of one work item */

typedef struct {
    int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq;
} Shape;

typedef struct {  /* one sequence: its new tokens and the keys they see */
    int64_t query_start, query_len, prefix_len, context_len;
    int64_t first_key;   /* the first key any new token sees */
    int64_t key_start;   /* first_key rounded down to a tile: the first tile's first key */
    int64_t num_tiles, first_tile;  /* its tiles, from first_tile on in each kv head's scratch */
} Sequence;

/* Lanes of one K tile, and floats of one V tile. */
static inline int64_t tile_lanes(Shape shape) { return TILE_KEYS * shape.head_dim / DIMS_PER_LANE; }
static inline int64_t v_tile_lanes(Shape shape) { return TILE_KEYS * shape.head_dim; }

static inline int64_t window_start(int64_t position, int64_t sliding_window) {
    return sliding_window > 0 && position >= sliding_window ? position - sliding_window + 1 : 0;
}

/* Lane c of a row: dims c * DIMS_PER_LANE onwards. */
static inline lane_t row_lane(const elem_t *row, int64_t c) {
#ifdef BFLOAT16
    return row[2 * c] | (uint32_t)row[2 * c + 1] << 16;
#else
    return row[c];
#endif
}

/* Pass 1: sequence seq's keys of kv head h into its tiles; keys before first_key (which the pool
 * may not hold) or past the context are zero. */
static void pack_tiles(lane_t *restrict k_tiles, float *restrict v_tiles, const elem_t *k_cache,
                       const elem_t *v_cache, const int32_t *block_table, Sequence seq, int64_t h, Shape shape) {
    const int64_t lanes = shape.head_dim / DIMS_PER_LANE, token_stride = shape.num_kv_heads * shape.head_dim;
    for (int64_t tile = 0; tile < seq.num_tiles; tile++) {
        lane_t *restrict k_tile = k_tiles + tile * tile_lanes(shape);
        for (int64_t i = 0; i < TILE_KEYS; i++) {
            const int64_t key = seq.key_start + tile * TILE_KEYS + i;
            float *restrict v_lanes = v_tiles + (tile * TILE_KEYS + i) * shape.head_dim;
            if (key < seq.first_key || key >= seq.context_len) {
                for (int64_t c = 0; c < lanes; c++) k_tile[c * TILE_KEYS + i] = 0;
                memset(v_lanes, 0, shape.head_dim * sizeof *v_lanes);
                continue;
            }
            const int64_t offset = (int64_t)block_table[key / shape.block_size] * shape.block_size * token_stride
                                   + key % shape.block_size * token_stride + h * shape.head_dim;
            const elem_t *k_row = k_cache + offset, *v_row = v_cache + offset;
            for (int64_t c = 0; c < lanes; c++) k_tile[c * TILE_KEYS + i] = row_lane(k_row, c);
            for (int64_t d = 0; d < shape.head_dim; d++) v_lanes[d] = load(v_row[d]);
        }
    }
}

/* Keys a query row at `position` sees in the tile from `first_key`: bit i for key first_key + i. */
static inline uint32_t visible_keys(int64_t first_key, int64_t position, int64_t sliding_window) {
    uint32_t bits = 0;
    const int64_t low = window_start(position, sliding_window);
    for (int i = 0; i < TILE_KEYS; i++) bits |= (uint32_t)(first_key + i >= low && first_key + i <= position) << i;
    return bits;
}

/* The online softmax's step for one query row: its running max and sum take this tile's scores
 * (only the visible ones), which become probabilities, zero where hidden; returns the factor that
 * rescales the row's output so far. */
static inline float softmax_step(float probs[TILE_KEYS], float *max_score, float *total,
                                 const float scores[TILE_KEYS], uint32_t visible) {
    float tile_max = -INFINITY;
    for (int i = 0; i < TILE_KEYS; i++)
        if (visible >> i & 1) tile_max = scores[i] > tile_max ? scores[i] : tile_max;
    if (tile_max == -INFINITY) {
        memset(probs, 0, TILE_KEYS * sizeof *probs);
        return 1.0f;
    }
    const float new_max = tile_max > *max_score ? tile_max : *max_score;
    const float rescale = *max_score == -INFINITY ? 0.0f : exp_nonpositive(*max_score - new_max);
    float tile_total = 0.0f;
    for (int i = 0; i < TILE_KEYS; i++) {
        probs[i] = visible >> i & 1 ? exp_nonpositive(scores[i] - new_max) : 0.0f;
        tile_total += probs[i];
    }
    *max_score = new_max;
    *total = *total * rescale + tile_total;
    return rescale;
}

/* Two lanes' product summed over their dims, in float32 (exact products for bfloat16). */
static inline float lane_dot(lane_t a, lane_t b) {
#ifdef BFLOAT16
    return bfloat16_to_float(a & 0xffff) * bfloat16_to_float(b & 0xffff)
           + bfloat16_to_float(a >> 16) * bfloat16_to_float(b >> 16);
#else
    return a * b;
#endif
}

/* Pass 2, portable: one query row (query head q_row at `position`) over its sequence's tiles. */
static void attend_row(elem_t *restrict out_row, const lane_t *restrict q_lanes, const lane_t *k_tiles,
                       const float *v_tiles, Sequence seq, int64_t position, Shape shape, float scale,
                       int64_t sliding_window) {
    const int64_t lanes = shape.head_dim / DIMS_PER_LANE;
    float max_score = -INFINITY, total = 0.0f, acc[shape.head_dim];
    memset(acc, 0, sizeof acc);
    const int64_t first_tile = (window_start(position, sliding_window) - seq.key_start) / TILE_KEYS;
    for (int64_t tile = first_tile; tile <= (position - seq.key_start) / TILE_KEYS; tile++) {
        const lane_t *k_tile = k_tiles + tile * tile_lanes(shape);
        const float *v_tile = v_tiles + tile * v_tile_lanes(shape);
        float scores[TILE_KEYS] = {0};
        for (int64_t c = 0; c < lanes; c++)
            for (int i = 0; i < TILE_KEYS; i++) scores[i] += lane_dot(q_lanes[c], k_tile[c * TILE_KEYS + i]);
        for (int i = 0; i < TILE_KEYS; i++) scores[i] *= scale;
        float probs[TILE_KEYS];
        const float rescale = softmax_step(probs, &max_score, &total, scores,
                                           visible_keys(seq.key_start + tile * TILE_KEYS, position, sliding_window));
        for (int64_t d = 0; d < shape.head_dim; d++) acc[d] *= rescale;
        for (int i = 0; i < TILE_KEYS; i++)
            for (int64_t d = 0; d < shape.head_dim; d++) acc[d] += probs[i] * v_tile[i * shape.head_dim + d];
    }
    for (int64_t d = 0; d < shape.head_dim; d++) out_row[d] = store(acc[d] / total);
}

#ifdef VECTORISED
#define QUERY_BLOCK 4        /* query rows sharing each tile row read, head_dim <= 64 */
#define MAX_CHUNKS 16        /* head_dim / 16 */

/* 16 keys' partial scores plus a query lane times a K tile's row of lanes. */
static inline __m512 lane_fma(__m512 sums, lane_t q_lane, const lane_t *k_row) {
#ifdef BFLOAT16
    return _mm512_dpbf16_ps(sums, (__m512bh)_mm512_set1_epi32((int32_t)q_lane), (__m512bh)_mm512_loadu_si512(k_row));
#else
    return _mm512_fmadd_ps(_mm512_set1_ps(q_lane), _mm512_loadu_ps(k_row), sums);
#endif
}

/* 16 float32 lanes stored as 16 elements. */
static inline void store16(elem_t *p, __m512 x) {
#ifdef BFLOAT16
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(x));
#else
    _mm512_storeu_ps(p, x);
#endif
}

/* Pass 2 for `rows` (<= QUERY_BLOCK) query rows of one kv head at once, head_dim = 16 * chunks,
 * rows * chunks <= 16; inlined with constant rows and chunks. Row r is query head q_lanes[r] at
 * positions[r]; the rows' output accumulates in registers. */
static inline __attribute__((always_inline)) void attend_rows_x16(
    elem_t *out_rows[], const lane_t *q_lanes[], const int64_t positions[], const lane_t *k_tiles,
    const float *v_tiles, Sequence seq, Shape shape, float scale, int64_t sliding_window, const int rows,
    const int chunks) {
    __m512 acc[QUERY_BLOCK * MAX_CHUNKS / 4];  /* [rows, chunks] */
    float max_score[QUERY_BLOCK];
    __m512 totals[QUERY_BLOCK];  /* each row's sum of probabilities, by lane */
    const __m512i key_offsets = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t first_tile = INT64_MAX, last_tile = 0;
    for (int r = 0; r < rows; r++) {
        max_score[r] = -INFINITY, totals[r] = _mm512_setzero_ps();
        const int64_t first = (window_start(positions[r], sliding_window) - seq.key_start) / TILE_KEYS;
        const int64_t last = (positions[r] - seq.key_start) / TILE_KEYS;
        first_tile = first < first_tile ? first : first_tile;
        last_tile = last > last_tile ? last : last_tile;
    }
    for (int i = 0; i < rows * chunks; i++) acc[i] = _mm512_setzero_ps();
    const __m512 scales = _mm512_set1_ps(scale);
    for (int64_t tile = first_tile; tile <= last_tile; tile++) {
        const lane_t *k_tile = k_tiles + tile * tile_lanes(shape);
        const float *v_tile = v_tiles + tile * v_tile_lanes(shape);
        __m512 sums[QUERY_BLOCK];
        for (int r = 0; r < rows; r++) sums[r] = _mm512_setzero_ps();
        for (int c = 0; c < 16 / DIMS_PER_LANE * chunks; c++)
            for (int r = 0; r < rows; r++) sums[r] = lane_fma(sums[r], q_lanes[r][c], k_tile + c * TILE_KEYS);
        float probs[QUERY_BLOCK][TILE_KEYS];
        const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(seq.key_start + tile * TILE_KEYS)), key_offsets);
        for (int r = 0; r < rows; r++) {
            const __mmask16 visible =
                _mm512_cmple_epi32_mask(keys, _mm512_set1_epi32((int32_t)positions[r]))
                & _mm512_cmpge_epi32_mask(keys, _mm512_set1_epi32((int32_t)window_start(positions[r], sliding_window)));
            const __m512 scores = _mm512_mul_ps(scales, sums[r]);
            const float tile_max = visible ? _mm512_mask_reduce_max_ps(visible, scores) : -INFINITY;
            if (tile_max > max_score[r]) {  /* a new max rescales what the row has summed */
                const __m512 rescale = _mm512_set1_ps(max_score[r] == -INFINITY ? 0.0f : exp_nonpositive(max_score[r] - tile_max));
                max_score[r] = tile_max;
                totals[r] = _mm512_mul_ps(totals[r], rescale);
                for (int c = 0; c < chunks; c++) acc[r * chunks + c] = _mm512_mul_ps(acc[r * chunks + c], rescale);
            }
            const __m512 exps = _mm512_maskz_mov_ps(
                visible, exp16(_mm512_maskz_sub_ps(visible, scores, _mm512_set1_ps(max_score[r]))));
            totals[r] = _mm512_add_ps(totals[r], exps);
            _mm512_storeu_ps(probs[r], exps);
        }
        for (int i = 0; i < TILE_KEYS; i++)
            for (int c = 0; c < chunks; c++) {
                const __m512 values = _mm512_loadu_ps(v_tile + i * shape.head_dim + 16 * c);
                for (int r = 0; r < rows; r++)
                    acc[r * chunks + c] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r][i]), values, acc[r * chunks + c]);
            }
    }
    for (int r = 0; r < rows; r++) {
        const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(totals[r]));
        for (int c = 0; c < chunks; c++) store16(out_rows[r] + 16 * c, _mm512_mul_ps(acc[r * chunks + c], inverse));
    }
}

/* Rows at a time, keeping rows * chunks accumulators within 16 registers. */
static int rows_per_block(int64_t chunks) { return chunks <= 4 ? 4 : chunks <= 8 ? 2 : 1; }

static void attend_rows(elem_t *out_rows[], const lane_t *q_lanes[], const int64_t positions[], const lane_t *k_tiles,
                        const float *v_tiles, Sequence seq, Shape shape, float scale, int64_t sliding_window, int rows) {
    switch (shape.head_dim / 16 * 8 + rows) {  /* chunks, rows: every pair rows_per_block allows */
#define ATTEND_ROWS(CHUNKS, ROWS)                                                                                  \
    case CHUNKS * 8 + ROWS:                                                                                        \
        attend_rows_x16(out_rows, q_lanes, positions, k_tiles, v_tiles, seq, shape, scale, sliding_window, ROWS, CHUNKS); \
        return;
        ATTEND_ROWS(1, 1) ATTEND_ROWS(1, 2) ATTEND_ROWS(1, 3) ATTEND_ROWS(1, 4)
        ATTEND_ROWS(2, 1) ATTEND_ROWS(2, 2) ATTEND_ROWS(2, 3) ATTEND_ROWS(2, 4)
        ATTEND_ROWS(3, 1) ATTEND_ROWS(3, 2) ATTEND_ROWS(3, 3) ATTEND_ROWS(3, 4)
        ATTEND_ROWS(4, 1) ATTEND_ROWS(4, 2) ATTEND_ROWS(4, 3) ATTEND_ROWS(4, 4)
        ATTEND_ROWS(5, 1) ATTEND_ROWS(5, 2) ATTEND_ROWS(6, 1) ATTEND_ROWS(6, 2)
        ATTEND_ROWS(7, 1) ATTEND_ROWS(7, 2) ATTEND_ROWS(8, 1) ATTEND_ROWS(8, 2)
        ATTEND_ROWS(16, 1)
#undef ATTEND_ROWS
    }
}
#endif

/* 1 when pass 2 runs on AVX-512 for this head_dim, else 0 (portable C). */
int32_t prefill_attention_vectorised(int64_t head_dim) {
#ifdef VECTORISED
    return head_dim % 16 == 0 && (head_dim <= 128 || head_dim == 256);
#else
    (void)head_dim;
    return 0;
#endif
}

/* Pass 2 for one work item: new tokens first_row..first_row + QUERY_ROWS - 1 of a sequence, every
 * query head of kv head h. */
static void attend_item(elem_t *out, const elem_t *query, const lane_t *k_tiles, const float *v_tiles,
                        Sequence seq, int64_t h, int64_t first_row, Shape shape, float scale, int64_t sliding_window) {
    const int64_t group_size = shape.num_heads / shape.num_kv_heads;
    const int64_t end_row = first_row + QUERY_ROWS < seq.query_len ? first_row + QUERY_ROWS : seq.query_len;
    const int64_t num_rows = (end_row - first_row) * group_size;  /* (new token, query head of the group) */
    int block = 1;
#ifdef VECTORISED
    const int vectorised = prefill_attention_vectorised(shape.head_dim);
    if (vectorised) block = rows_per_block(shape.head_dim / 16);
#endif
    for (int64_t row = 0; row < num_rows; row += block) {
        const int rows = num_rows - row < block ? (int)(num_rows - row) : block;
        elem_t *out_rows[4];
        const lane_t *q_lanes[4];
        int64_t positions[4];
        for (int r = 0; r < rows; r++) {
            const int64_t token = first_row + (row + r) / group_size, head = h * group_size + (row + r) % group_size;
            const int64_t offset = ((seq.query_start + token) * shape.num_heads + head) * shape.head_dim;
            out_rows[r] = out + offset;
            q_lanes[r] = (const lane_t *)(query + offset);
            positions[r] = seq.prefix_len + token;
        }
#ifdef VECTORISED
        if (vectorised) {
            attend_rows(out_rows, q_lanes, positions, k_tiles, v_tiles, seq, shape, scale, sliding_window, rows);
            continue;
        }
#endif
        attend_row(out_rows[0], q_lanes[0], k_tiles, v_tiles, seq, positions[0], shape, scale, sliding_window);
    }
}

static int in_range(const int32_t *block_table, Sequence seq, int64_t num_blocks, Shape shape) {
    if (seq.query_len < 0 || seq.prefix_len < 0 || seq.context_len > shape.max_blocks_per_seq * shape.block_size)
        return 0;
    for (int64_t b = seq.first_key / shape.block_size; b < (seq.context_len + shape.block_size - 1) / shape.block_size; b++)
        if (block_table[b] < 0 || block_table[b] >= num_blocks) return 0;
    return 1;
}

int64_t paged_prefill_attention(elem_t *out, const elem_t *query, const elem_t *k_cache, const elem_t *v_cache,
                                const int32_t *block_tables, const int32_t *query_start_loc, const int32_t *context_lens,
                                int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq, float scale,
                                int64_t sliding_window, int32_t num_threads) {
    const Shape shape = {num_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq};
    Sequence *seqs = malloc((num_seqs + 1) * sizeof *seqs);
    int64_t *item_starts = malloc((num_seqs + 1) * sizeof *item_starts);  /* first work item of each sequence */
    if (seqs == NULL || item_starts == NULL) {
        free(seqs), free(item_starts);
        return -1;
    }
    int64_t num_tiles = 0, num_items = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        Sequence seq = {.query_start = query_start_loc[s], .query_len = query_start_loc[s + 1] - query_start_loc[s],
                        .context_len = context_lens[s]};
        seq.prefix_len = seq.context_len - seq.query_len;
        seq.first_key = window_start(seq.prefix_len, sliding_window);
        seq.key_start = seq.first_key / TILE_KEYS * TILE_KEYS;
        seq.num_tiles = (seq.context_len - seq.key_start + TILE_KEYS - 1) / TILE_KEYS;
        seq.first_tile = num_tiles;
        if (!in_range(block_tables + s * max_blocks_per_seq, seq, num_blocks, shape)) {
            free(seqs), free(item_starts);
            return s + 1;
        }
        seqs[s] = seq;
        item_starts[s] = num_items;
        num_tiles += seq.num_tiles * num_kv_heads;
        num_items += (seq.query_len + QUERY_ROWS - 1) / QUERY_ROWS * num_kv_heads;
    }
    item_starts[num_seqs] = num_items;
    /* [num_tiles] of each: sequence s's tiles of kv head h from (first_tile + h * num_tiles) on */
    lane_t *k_tiles = malloc(num_tiles * tile_lanes(shape) * sizeof *k_tiles);
    float *v_tiles = malloc(num_tiles * v_tile_lanes(shape) * sizeof *v_tiles);
    const int out_of_memory = k_tiles == NULL || v_tiles == NULL;
    if (!out_of_memory) {
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
        {
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_seqs * num_kv_heads; i++) {
                const Sequence seq = seqs[i / num_kv_heads];
                const int64_t tile = seq.first_tile + i % num_kv_heads * seq.num_tiles;
                pack_tiles(k_tiles + tile * tile_lanes(shape), v_tiles + tile * v_tile_lanes(shape), k_cache, v_cache,
                           block_tables + i / num_kv_heads * max_blocks_per_seq, seq, i % num_kv_heads, shape);
            }
            int64_t s = 0;
#pragma omp for schedule(dynamic, 1)
            for (int64_t item = num_items - 1; item >= 0; item--) {  /* the latest rows, which see most keys, first */
                while (item_starts[s + 1] <= item) s++;
                while (item_starts[s] > item) s--;
                const Sequence seq = seqs[s];
                const int64_t h = (item - item_starts[s]) % num_kv_heads, block = (item - item_starts[s]) / num_kv_heads;
                const int64_t tile = seq.first_tile + h * seq.num_tiles;
                attend_item(out, query, k_tiles + tile * tile_lanes(shape), v_tiles + tile * v_tile_lanes(shape), seq, h, block * QUERY_ROWS, shape, scale,
                            sliding_window);
            }
        }
    }
    free(seqs), free(item_starts), free(k_tiles), free(v_tiles);
    return out_of_memory ? -1 : 0;
}
