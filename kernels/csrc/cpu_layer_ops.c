/* A decoder layer's elementwise ops for CPU, one pass over memory each: RMSNorm (alone, or after
 * the residual add), the rotary embedding (rotate-half), the gated MLP's SiLU-and-multiply and the
 * copy of new tokens' K and V into a float pool. Tensors hold float32, or bfloat16 when built with -DBFLOAT16;
 * arithmetic is float32, and a bfloat16 build rounds where the Hugging Face modules round (after
 * each torch op), so both agree with them to the last bit but for summation order.
 *
 * Layouts (contiguous, row-major):
 *   rms_norm      out, x [num_rows, hidden]; weight [hidden]
 *   add_rms_norm  out, residual, x [num_rows, hidden]; residual += x in place, then normalised
 *   rotary        x [num_tokens, num_heads, head_dim] with rows token_stride apart (a view into
 *                 the fused qkv projection), rotated in place over each head's first rotary_dim;
 *                 cos, sin [num_tokens, rotary_dim]
 *   silu_and_mul  out [num_rows, width]; gate_up [num_rows, 2 * width], gate then up
 *   store_kv      k_cache, v_cache [num_slots, row_len]; key, value [num_tokens, row_len] with rows
 *                 key_stride (value_stride) apart (views into the fused qkv projection); slot_mapping
 *                 [num_tokens] int64
 * SiLU's division is a vector division in torch, which costs several times the rest of SiLU on the
 * CPUs measured; with AVX-512 this takes an approximate reciprocal and one Newton step instead
 * (within 2 float32 ulp of the quotient), and e^x by a polynomial (within 1e-7 relative).
 */
#include <math.h>
#include <string.h>

#include "elem.h"
#include "exp_poly.h"

/* A value as the tensor's dtype holds it: what a torch op between two others leaves. */
static inline float rounded(float x) { return load(store(x)); }

#ifdef __AVX512F__
#ifdef BFLOAT16
/* Each lane's bfloat16 (to nearest even, NaN kept quiet) in its low 16 bits. */
static inline __m512i bfloat16_bits(__m512 x) {
#ifdef __AVX512BF16__
    return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));  /* (flushing denormals, as no model's values are) */
#endif
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i top = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(top, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
}
#endif

/* Each lane rounded to the dtype and stored. */
static inline void store16(elem_t *p, __m512 x) {
#ifdef BFLOAT16
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(bfloat16_bits(x)));
#else
    _mm512_storeu_ps(p, x);
#endif
}

/* Each lane as the dtype holds it. */
static inline __m512 rounded16(__m512 x) {
#ifdef BFLOAT16
    return _mm512_castsi512_ps(_mm512_slli_epi32(bfloat16_bits(x), 16));
#else
    return x;
#endif
}
#endif

/* out = normalize(x) * weight (Llama: the normalised row rounded to the dtype, then times weight,
 * rounded) or normalize(x) * (1 + weight) (Gemma: in float32, rounded once). */
void rms_norm(elem_t *out, const elem_t *x, const elem_t *weight, int64_t num_rows, int64_t hidden, float eps,
              int32_t adds_one) {
    for (int64_t r = 0; r < num_rows; r++) {
        const elem_t *restrict row = x + r * hidden;
        elem_t *restrict out_row = out + r * hidden;
        float sum_squares = 0.0f;
        int64_t i = 0;
#ifdef __AVX512F__
        __m512 sums = _mm512_setzero_ps();
        for (; i + 16 <= hidden; i += 16) sums = _mm512_fmadd_ps(load16(row + i), load16(row + i), sums);
        sum_squares = _mm512_reduce_add_ps(sums);
#endif
        for (; i < hidden; i++) sum_squares += load(row[i]) * load(row[i]);
        const float inv_rms = 1.0f / sqrtf(sum_squares / (float)hidden + eps);
        i = 0;
#ifdef __AVX512F__
        const __m512 inv_rms16 = _mm512_set1_ps(inv_rms), ones = _mm512_set1_ps(1.0f);
        for (; i + 16 <= hidden; i += 16) {
            const __m512 normalized = _mm512_mul_ps(load16(row + i), inv_rms16), w = load16(weight + i);
            store16(out_row + i, adds_one ? _mm512_mul_ps(normalized, _mm512_add_ps(ones, w))
                                          : _mm512_mul_ps(w, rounded16(normalized)));
        }
#endif
        for (; i < hidden; i++)
            out_row[i] = adds_one ? store(load(row[i]) * inv_rms * (1.0f + load(weight[i])))
                                  : store(load(weight[i]) * rounded(load(row[i]) * inv_rms));
    }
}

/* residual = residual + x, rounded to the dtype as torch's add rounds it; out = rms_norm(residual). */
void add_rms_norm(elem_t *out, elem_t *residual, const elem_t *x, const elem_t *weight, int64_t num_rows, int64_t hidden,
                  float eps, int32_t adds_one) {
    int64_t i = 0;
    const int64_t size = num_rows * hidden;
#ifdef __AVX512F__
    for (; i + 16 <= size; i += 16) store16(residual + i, _mm512_add_ps(load16(residual + i), load16(x + i)));
#endif
    for (; i < size; i++) residual[i] = store(load(residual[i]) + load(x[i]));
    rms_norm(out, residual, weight, num_rows, hidden, eps, adds_one);
}

static inline __attribute__((always_inline)) void rotate_rows(
    elem_t *x, const elem_t *cos, const elem_t *sin, int64_t num_tokens, int64_t token_stride, int64_t num_heads,
    int64_t head_dim, const int64_t half) {
    for (int64_t t = 0; t < num_tokens; t++) {
        const elem_t *restrict c = cos + t * 2 * half, *restrict s = sin + t * 2 * half;
        for (int64_t h = 0; h < num_heads; h++) {
            elem_t *restrict head = x + t * token_stride + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float x1 = load(head[i]), x2 = load(head[i + half]);
                head[i] = store(rounded(x1 * load(c[i])) + rounded(-x2 * load(s[i])));
                head[i + half] = store(rounded(x2 * load(c[i + half])) + rounded(x1 * load(s[i + half])));
            }
        }
    }
}

/* x = x * cos + rotate_half(x) * sin over each head's first rotary_dim, rotate_half(x) being
 * (-x2, x1) for the halves x1, x2; each product and the sum rounded as torch rounds them. The
 * common rotary dims get a loop of constant length (unrolled, no remainder). */
void rotary(elem_t *x, const elem_t *cos, const elem_t *sin, int64_t num_tokens, int64_t token_stride,
            int64_t num_heads, int64_t head_dim, int64_t rotary_dim) {
    switch (rotary_dim) {
        case 32: rotate_rows(x, cos, sin, num_tokens, token_stride, num_heads, head_dim, 16); return;
        case 64: rotate_rows(x, cos, sin, num_tokens, token_stride, num_heads, head_dim, 32); return;
        case 128: rotate_rows(x, cos, sin, num_tokens, token_stride, num_heads, head_dim, 64); return;
        default: rotate_rows(x, cos, sin, num_tokens, token_stride, num_heads, head_dim, rotary_dim / 2);
    }
}

/* silu(g) = g / (1 + e^-g), rounded as torch's silu rounds it; scalar, for what the vectors leave. */
static inline float silu(float g) { return rounded(g / (1.0f + expf(-g))); }

#ifdef __AVX512F__
/* silu(g) for 16 lanes: g times the reciprocal of 1 + e^-g, by rcp14 and one Newton step. */
static inline __m512 silu16(__m512 g) {
    const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
    __m512 r = _mm512_rcp14_ps(d);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
    return _mm512_mul_ps(g, r);
}
#endif

/* out = silu(gate) * up, rounded after each op as torch rounds act(gate) * up. */
void silu_and_mul(elem_t *out, const elem_t *gate_up, int64_t num_rows, int64_t width) {
    for (int64_t r = 0; r < num_rows; r++) {
        const elem_t *restrict gate = gate_up + r * 2 * width, *restrict up = gate + width;
        elem_t *restrict out_row = out + r * width;
        int64_t i = 0;
#ifdef __AVX512F__
        for (; i + 16 <= width; i += 16)
            store16(out_row + i, _mm512_mul_ps(rounded16(silu16(load16(gate + i))), load16(up + i)));
#endif
        for (; i < width; i++) out_row[i] = store(silu(load(gate[i])) * load(up[i]));
    }
}

/* Token t's K and V rows into slot slot_mapping[t] of each pool. Returns 0, or 1 + the first token
 * whose slot is outside the pool (nothing is written then). */
int64_t store_kv(elem_t *k_cache, elem_t *v_cache, const elem_t *key, const elem_t *value, const int64_t *slot_mapping,
                 int64_t num_tokens, int64_t row_len, int64_t key_stride, int64_t value_stride, int64_t num_slots) {
    for (int64_t t = 0; t < num_tokens; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots) return t + 1;
    for (int64_t t = 0; t < num_tokens; t++) {
        memcpy(k_cache + slot_mapping[t] * row_len, key + t * key_stride, row_len * sizeof(elem_t));
        memcpy(v_cache + slot_mapping[t] * row_len, value + t * value_stride, row_len * sizeof(elem_t));
    }
    return 0;
}
