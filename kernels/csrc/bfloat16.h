/* bfloat16 <-> float32 for one value, as torch converts: the compiled CPU kernels' scalar paths. */
#ifndef PDSERVE_BFLOAT16_H
#define PDSERVE_BFLOAT16_H

#include <stdint.h>

/* Exact: a bfloat16 is the top half of a float32. */
static inline float bfloat16_to_float(uint16_t x) {
    const union { uint32_t bits; float value; } widened = {.bits = (uint32_t)x << 16};
    return widened.value;
}

/* Round to nearest even, as torch rounds float32 to bfloat16 (NaN kept quiet). */
static inline uint16_t float_to_bfloat16(float x) {
    const union { float value; uint32_t bits; } in = {.value = x};
    if ((in.bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((in.bits >> 16) | 0x40);
    return (uint16_t)((in.bits + 0x7fffu + ((in.bits >> 16) & 1u)) >> 16);
}

#endif
