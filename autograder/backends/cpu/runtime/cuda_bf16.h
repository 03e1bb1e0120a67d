// CUDA's cuda_bf16.h for the CPU backend: __nv_bfloat16 keeps the upper 16 bits of a float, rounded to nearest
// even, and computes through float, each result rounded back, as the GPU's bfloat16 arithmetic does.
#pragma once

struct __align__(2) __nv_bfloat16 {
    unsigned short bits;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16(float a) {
    unsigned int u = __float_as_uint(a);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}
static inline __nv_bfloat16 __float2bfloat16_rn(float a) { return __float2bfloat16(a); }
static inline float __bfloat162float(__nv_bfloat16 a) { return __uint_as_float((unsigned int)a.bits << 16); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16(a), __float2bfloat16(b)};
}
static inline float __low2float(__nv_bfloat162 a) { return __bfloat162float(a.x); }
static inline float __high2float(__nv_bfloat162 a) { return __bfloat162float(a.y); }

#define AG_BF16_OP(name, expression)                                                                          \
    static inline __nv_bfloat16 name(__nv_bfloat16 a, __nv_bfloat16 b) {                                      \
        const float x = __bfloat162float(a), y = __bfloat162float(b);                                        \
        return __float2bfloat16(expression);                                                                  \
    }
AG_BF16_OP(__hadd, x + y)
AG_BF16_OP(__hsub, x - y)
AG_BF16_OP(__hmul, x * y)
AG_BF16_OP(__hdiv, x / y)
AG_BF16_OP(__hmax, x < y ? y : x)
AG_BF16_OP(__hmin, y < x ? y : x)
AG_BF16_OP(operator+, x + y)
AG_BF16_OP(operator-, x - y)
AG_BF16_OP(operator*, x * y)
AG_BF16_OP(operator/, x / y)
#undef AG_BF16_OP
