/* A little-endian fp16 in memory, widened exactly to float32 (F16C where present, else by its
 * bits): the block kernels' scales. Include after <immintrin.h> where F16C is used. */
#ifndef PDSERVE_FP16_H
#define PDSERVE_FP16_H

#include <stdint.h>
#include <string.h>

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    union { uint32_t bits; float value; } f;
    if (exponent == 0x1f) {
        f.bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        f.bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {  /* zero or subnormal: mantissa * 2^-24, exact */
        f.value = (float)mantissa * 5.9604644775390625e-8f;
        f.bits |= sign;
    }
    return f.value;
#endif
}

#endif
