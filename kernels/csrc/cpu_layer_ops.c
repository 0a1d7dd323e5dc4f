/* A decoder layer's elementwise ops for CPU, one pass over memory each: RMSNorm and the rotary
 * embedding (rotate-half). Tensors hold float32, or bfloat16 when built with -DBFLOAT16;
 * arithmetic is float32, and a bfloat16 build rounds where the Hugging Face modules round (after
 * each torch op), so both agree with them to the last bit but for summation order.
 *
 * Layouts (contiguous, row-major):
 *   rms_norm      out, x [num_rows, hidden]; weight [hidden]
 *   rotary        x [num_tokens, num_heads, head_dim] with rows token_stride apart (a view into
 *                 the fused qkv projection), rotated in place over each head's first rotary_dim;
 *                 cos, sin [num_tokens, rotary_dim]
 * (SiLU-and-multiply stays torch's: it divides per element, and on the CPUs measured a vector
 * division costs several times what the rest of it does, in C as in torch.)
 */
#include <math.h>
#include <stdint.h>

#ifdef BFLOAT16
typedef uint16_t elem_t;
static inline float load(elem_t x) {
    const union { uint32_t bits; float value; } widened = {.bits = (uint32_t)x << 16};
    return widened.value;
}
/* Round to nearest even, as torch rounds float32 to bfloat16 (NaN kept quiet). */
static inline elem_t store(float x) {
    const union { float value; uint32_t bits; } in = {.value = x};
    if ((in.bits & 0x7fffffffu) > 0x7f800000u) return (elem_t)((in.bits >> 16) | 0x40);
    return (elem_t)((in.bits + 0x7fffu + ((in.bits >> 16) & 1u)) >> 16);
}
#else
typedef float elem_t;
static inline float load(elem_t x) { return x; }
static inline elem_t store(float x) { return x; }
#endif
/* A value as the tensor's dtype holds it: what a torch op between two others leaves. */
static inline float rounded(float x) { return load(store(x)); }

/* out = normalize(x) * weight (Llama: the normalised row rounded to the dtype, then times weight,
 * rounded) or normalize(x) * (1 + weight) (Gemma: in float32, rounded once). */
void rms_norm(elem_t *out, const elem_t *x, const elem_t *weight, int64_t num_rows, int64_t hidden, float eps,
              int32_t adds_one) {
    for (int64_t r = 0; r < num_rows; r++) {
        const elem_t *restrict row = x + r * hidden;
        elem_t *restrict out_row = out + r * hidden;
        float sum_squares = 0.0f;
#pragma omp simd reduction(+ : sum_squares)
        for (int64_t i = 0; i < hidden; i++) sum_squares += load(row[i]) * load(row[i]);
        const float inv_rms = 1.0f / sqrtf(sum_squares / (float)hidden + eps);
        if (adds_one) {
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) out_row[i] = store(load(row[i]) * inv_rms * (1.0f + load(weight[i])));
        } else {
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) out_row[i] = store(load(weight[i]) * rounded(load(row[i]) * inv_rms));
        }
    }
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
