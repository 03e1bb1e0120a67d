// CUDA's cuda_fp16.h for the CPU backend: __half is the compiler's IEEE binary16 (_Float16), so conversions
// round as on a GPU and arithmetic rounds each result to half precision. The common conversions and
// arithmetic intrinsics are here; shuffles and atomics of a __half go through the prelude's templates.
#pragma once

typedef _Float16 __half;
struct __align__(4) __half2 {
    __half x, y;
};

static inline __half __float2half(float a) { return (__half)a; }
static inline __half __float2half_rn(float a) { return (__half)a; }
static inline float __half2float(__half a) { return (float)a; }
static inline __half __int2half_rn(int a) { return (__half)a; }
static inline int __half2int_rn(__half a) { return (int)nearbyintf((float)a); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{(__half)a, (__half)b}; }
static inline __half2 __float2half2_rn(float a) { return __half2{(__half)a, (__half)a}; }
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
static inline float __low2float(__half2 a) { return (float)a.x; }
static inline float __high2float(__half2 a) { return (float)a.y; }
static inline __half __low2half(__half2 a) { return a.x; }
static inline __half __high2half(__half2 a) { return a.y; }

static inline __half __hadd(__half a, __half b) { return a + b; }
static inline __half __hsub(__half a, __half b) { return a - b; }
static inline __half __hmul(__half a, __half b) { return a * b; }
static inline __half __hdiv(__half a, __half b) { return a / b; }
static inline __half __hneg(__half a) { return -a; }
static inline __half __habs(__half a) { return a < (__half)0 ? -a : a; }
static inline __half __hfma(__half a, __half b, __half c) { return (__half)fmaf((float)a, (float)b, (float)c); }
static inline __half __hmax(__half a, __half b) { return a < b ? b : a; }
static inline __half __hmin(__half a, __half b) { return b < a ? b : a; }
static inline bool __heq(__half a, __half b) { return a == b; }
static inline bool __hne(__half a, __half b) { return a != b; }
static inline bool __hlt(__half a, __half b) { return a < b; }
static inline bool __hle(__half a, __half b) { return a <= b; }
static inline bool __hgt(__half a, __half b) { return a > b; }
static inline bool __hge(__half a, __half b) { return a >= b; }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{a.x + b.x, a.y + b.y}; }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{a.x * b.x, a.y * b.y}; }
