/* Writes new tokens' K and V into an int8 KV pool (kernels/kv_quant.py), one entry per token and
 * kv head: scale = max |x| / 127, levels = x / scale rounded half to even (0 for a row of zeros),
 * the scale's float32 bytes after the levels. Inputs hold float32, or bfloat16 when built with
 * -DBFLOAT16 (widened exactly); the arithmetic is the reference's, float32 division included, so
 * the entries equal `quantize_entries`' bit for bit.
 *
 * Layouts:
 *   key, value       [num_tokens, num_kv_heads, head_dim], heads contiguous within a token, tokens
 *                    key_stride (value_stride) elements apart: views into the fused qkv projection
 *   k_cache, v_cache [num_slots, num_kv_heads, head_dim + 4] int8
 *   slot_mapping     [num_tokens] int64 flat slots
 */
#include "int8_levels.h"

static void quantize_entry(int8_t *restrict entry, const elem_t *restrict x, int64_t head_dim) {
    const float scale = quantize_row(entry, x, 0, head_dim);
    memcpy(entry + head_dim, &scale, sizeof scale);
}

void store_kv_int8(int8_t *k_cache, int8_t *v_cache, const elem_t *key, const elem_t *value,
                   const int64_t *slot_mapping, int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim,
                   int64_t key_stride, int64_t value_stride) {
    const int64_t entry_len = head_dim + (int64_t)sizeof(float);
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t slot = slot_mapping[t] * num_kv_heads * entry_len;
        for (int64_t h = 0; h < num_kv_heads; h++) {
            quantize_entry(k_cache + slot + h * entry_len, key + t * key_stride + h * head_dim, head_dim);
            quantize_entry(v_cache + slot + h * entry_len, value + t * value_stride + h * head_dim, head_dim);
        }
    }
}
