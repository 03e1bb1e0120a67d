// The CUDA C built-ins for the CPU backend. g++ force-includes this before the student's source.
//
// Every CUDA thread runs as a fiber of the runtime (ag_runtime.cpp). The built-in index variables are
// runtime globals that the scheduler sets at every switch; they are declared const here, which is both true
// for the code that reads them (a fiber's indices never change) and keeps the ThreadSanitizer
// instrumentation from hooking every read of them. Barriers and warp collectives are macros that pass
// __LINE__, so a deadlock report names the student's line.
#pragma once

#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#define __CUDACC__ 1
#define __CUDA_ARCH__ 800
#define CUDART_VERSION 12000

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// The backend rewrites every __shared__ declaration into the runtime's shared arena; this is a fallback for
// declarations it cannot take apart: they still work, unchecked. A source whose macros declare shared memory is
// preprocessed first (AG_PREPROCESSING), keeping __shared__ for the rewrite to see.
#ifndef AG_PREPROCESSING
#define __shared__ static
#endif

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

extern "C" {
extern const uint3 threadIdx;
extern const uint3 blockIdx;
extern const dim3 blockDim;
extern const dim3 gridDim;
extern unsigned char *const __ag_dynamic_shared;

void __ag_syncthreads(int line, int site = 0);
int __ag_syncthreads_op(int line, int op, int predicate, int site = 0);
unsigned long long __ag_warp(int line, int op, unsigned int mask, unsigned long long value, int arg, int width);
unsigned int __ag_activemask(void);
unsigned long long __ag_atomic(void *address, int size, int op, int type, unsigned long long value,
                               unsigned long long compare);
void *__ag_static_shared(unsigned long size, unsigned long align, const char *name);
unsigned char *__ag_dynamic_shared_of(const char *name);
void __ag_threadfence(void);
}

static constexpr int warpSize = 32;

// Each __syncthreads() in the source is a barrier of its own (__COUNTER__), also two on one line.
#define __syncthreads() __ag_syncthreads(__LINE__, __COUNTER__ + 1)
#define __syncthreads_count(p) __ag_syncthreads_op(__LINE__, 0, (p), __COUNTER__ + 1)
#define __syncthreads_and(p) __ag_syncthreads_op(__LINE__, 1, (p), __COUNTER__ + 1)
#define __syncthreads_or(p) __ag_syncthreads_op(__LINE__, 2, (p), __COUNTER__ + 1)
#define __threadfence() __ag_threadfence()
#define __threadfence_block() __ag_threadfence()
#define __threadfence_system() __ag_threadfence()

// Warp collectives: the operation codes are shared with ag_runtime.cpp.
enum { AG_SYNCWARP, AG_SHFL, AG_SHFL_UP, AG_SHFL_DOWN, AG_SHFL_XOR, AG_BALLOT, AG_ANY, AG_ALL,
       AG_REDUCE_ADD, AG_REDUCE_MIN, AG_REDUCE_MAX, AG_MATCH_ANY, AG_MATCH_ALL };

template <class T>
static inline unsigned long long __ag_bits(T value) {
    static_assert(sizeof(T) <= 8, "warp shuffles move values of at most 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    return bits;
}
template <class T>
static inline T __ag_from_bits(unsigned long long bits) {
    T value;
    std::memcpy(&value, &bits, sizeof(T));
    return value;
}
template <class T>
static inline T __ag_shuffle(int line, int op, unsigned int mask, T var, int arg, int width = 32) {
    return __ag_from_bits<T>(__ag_warp(line, op, mask, __ag_bits(var), arg, width));
}

#define __syncwarp(...) __ag_warp(__LINE__, AG_SYNCWARP, __ag_mask(__VA_ARGS__), 0, 0, 32)
static inline unsigned int __ag_mask(unsigned int mask = 0xffffffffu) { return mask; }
#define __shfl_sync(mask, ...) __ag_shuffle(__LINE__, AG_SHFL, (mask), __VA_ARGS__)
#define __shfl_up_sync(mask, ...) __ag_shuffle(__LINE__, AG_SHFL_UP, (mask), __VA_ARGS__)
#define __shfl_down_sync(mask, ...) __ag_shuffle(__LINE__, AG_SHFL_DOWN, (mask), __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) __ag_shuffle(__LINE__, AG_SHFL_XOR, (mask), __VA_ARGS__)
#define __ballot_sync(mask, p) ((unsigned int)__ag_warp(__LINE__, AG_BALLOT, (mask), !!(p), 0, 32))
#define __any_sync(mask, p) ((int)__ag_warp(__LINE__, AG_ANY, (mask), !!(p), 0, 32))
#define __all_sync(mask, p) ((int)__ag_warp(__LINE__, AG_ALL, (mask), !!(p), 0, 32))
#define __reduce_add_sync(mask, v) ((unsigned int)__ag_warp(__LINE__, AG_REDUCE_ADD, (mask), (unsigned int)(v), 0, 32))
#define __reduce_min_sync(mask, v) ((unsigned int)__ag_warp(__LINE__, AG_REDUCE_MIN, (mask), (unsigned int)(v), 0, 32))
#define __reduce_max_sync(mask, v) ((unsigned int)__ag_warp(__LINE__, AG_REDUCE_MAX, (mask), (unsigned int)(v), 0, 32))
#define __match_any_sync(mask, v) ((unsigned int)__ag_warp(__LINE__, AG_MATCH_ANY, (mask), __ag_bits(v), 0, 32))
#define __match_all_sync(mask, v, pred) __ag_match_all(__LINE__, (mask), __ag_bits(v), (pred))
static inline unsigned int __ag_match_all(int line, unsigned int mask, unsigned long long bits, int *pred) {
    const unsigned int lanes = (unsigned int)__ag_warp(line, AG_MATCH_ALL, mask, bits, 0, 32);
    *pred = lanes != 0;
    return lanes;
}
#define __activemask() __ag_activemask()

// Atomics run inside the runtime, which marks the access as atomic for the race checker.
enum { AG_ADD, AG_SUB, AG_EXCH, AG_MIN, AG_MAX, AG_CAS, AG_AND, AG_OR, AG_XOR, AG_INC, AG_DEC };
enum { AG_INT, AG_UNSIGNED, AG_FLOAT, AG_DOUBLE };

template <class T>
static inline constexpr int __ag_type() {
    if constexpr (std::is_same_v<T, float>) return AG_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return AG_DOUBLE;
    else if constexpr (std::is_signed_v<T>) return AG_INT;
    else return AG_UNSIGNED;
}
template <class T>
static inline T __ag_atomic_op(T *address, int op, T value, T compare = T()) {
    return __ag_from_bits<T>(__ag_atomic((void *)address, sizeof(T), op, __ag_type<T>(), __ag_bits(value),
                                         __ag_bits(compare)));
}

#define AG_ATOMIC(name, op, T)                                                                     \
    static inline T name(T *a, T v) { return __ag_atomic_op<T>(a, op, v); }                       \
    static inline T name##_block(T *a, T v) { return __ag_atomic_op<T>(a, op, v); }              \
    static inline T name##_system(T *a, T v) { return __ag_atomic_op<T>(a, op, v); }
#define AG_ATOMIC_INTS(name, op)                                                                   \
    AG_ATOMIC(name, op, int)                                                                       \
    AG_ATOMIC(name, op, unsigned int)                                                              \
    AG_ATOMIC(name, op, unsigned long long)
AG_ATOMIC_INTS(atomicAdd, AG_ADD)
AG_ATOMIC(atomicAdd, AG_ADD, float)
AG_ATOMIC(atomicAdd, AG_ADD, double)
AG_ATOMIC(atomicSub, AG_SUB, int)
AG_ATOMIC(atomicSub, AG_SUB, unsigned int)
AG_ATOMIC_INTS(atomicExch, AG_EXCH)
AG_ATOMIC(atomicExch, AG_EXCH, float)
AG_ATOMIC_INTS(atomicMin, AG_MIN)
AG_ATOMIC(atomicMin, AG_MIN, long long)
AG_ATOMIC_INTS(atomicMax, AG_MAX)
AG_ATOMIC(atomicMax, AG_MAX, long long)
AG_ATOMIC_INTS(atomicAnd, AG_AND)
AG_ATOMIC_INTS(atomicOr, AG_OR)
AG_ATOMIC_INTS(atomicXor, AG_XOR)
AG_ATOMIC(atomicInc, AG_INC, unsigned int)
AG_ATOMIC(atomicDec, AG_DEC, unsigned int)
#undef AG_ATOMIC_INTS
#undef AG_ATOMIC
template <class T>
static inline T atomicCAS(T *a, T compare, T value) { return __ag_atomic_op<T>(a, AG_CAS, value, compare); }

// Mixed-type min and max as CUDA has them (an int and an unsigned give an unsigned).
template <class A, class B>
static inline std::common_type_t<A, B> min(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
static inline std::common_type_t<A, B> max(A a, B b) {
    using T = std::common_type_t<A, B>;
    return (T)a < (T)b ? (T)b : (T)a;
}

// Intrinsics whose results are exact on a GPU too. The approximate ones (__fdividef, __expf, rsqrtf, ...) and the
// clocks are refused by the source policy: a GPU computes them otherwise (autograder/policy.py, _PLATFORM). Where a
// GPU's answer for NaN or a value out of range differs from x86's, the GPU's is given (PTX cvt: .sat flushes NaN to
// +0; a conversion to an integer saturates, and NaN converts to 0), or a kernel could tell the two apart by it.
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __uint2float_rn(unsigned int x) { return (float)x; }
static inline unsigned int __float2uint_rn(float x) {
    const float r = nearbyintf(x);
    return r > 0.0f ? (r < 4294967296.0f ? (unsigned int)r : 0xffffffffu) : 0u;
}
static inline float __ll2float_rn(long long x) { return (float)x; }
// Products of the low 24 bits (sign-extended for __mul24), as old GPUs computed indices fast: the low 32 bits.
static inline int __mul24(int x, int y) {
    long long a = (long long)(x & 0xffffff) - ((x & 0x800000) ? 0x1000000LL : 0);
    long long b = (long long)(y & 0xffffff) - ((y & 0x800000) ? 0x1000000LL : 0);
    return (int)(unsigned int)(unsigned long long)(a * b);
}
static inline unsigned int __umul24(unsigned int x, unsigned int y) { return (x & 0xffffffu) * (y & 0xffffffu); }
static inline int __mulhi(int x, int y) { return (int)(((long long)x * y) >> 32); }
static inline unsigned int __umulhi(unsigned int x, unsigned int y) {
    return (unsigned int)(((unsigned long long)x * y) >> 32);
}
static inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
    return (unsigned int)((((unsigned long long)hi << 32 | lo) << (shift & 31)) >> 32);
}
static inline unsigned int __funnelshift_lc(unsigned int lo, unsigned int hi, unsigned int shift) {
    return (unsigned int)((((unsigned long long)hi << 32 | lo) << (shift < 32 ? shift : 32)) >> 32);
}
static inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
    return (unsigned int)(((unsigned long long)hi << 32 | lo) >> (shift & 31));
}
static inline unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi, unsigned int shift) {
    return (unsigned int)(((unsigned long long)hi << 32 | lo) >> (shift < 32 ? shift : 32));
}
static inline int __ag_saturated_int(float r) {  // `r` a whole number, or NaN
    return r != r ? 0 : (r >= 2147483648.0f ? 2147483647 : (r < -2147483648.0f ? (-2147483647 - 1) : (int)r));
}
static inline int __float2int_rn(float x) { return __ag_saturated_int(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return __ag_saturated_int(truncf(x)); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __int_as_float(int x) { return __ag_from_bits<float>((unsigned int)x); }
static inline int __float_as_int(float x) { return (int)__ag_bits(x); }
static inline float __uint_as_float(unsigned int x) { return __ag_from_bits<float>(x); }
static inline unsigned int __float_as_uint(float x) { return (unsigned int)__ag_bits(x); }
static inline double __longlong_as_double(long long x) { return __ag_from_bits<double>((unsigned long long)x); }
static inline long long __double_as_longlong(double x) { return (long long)__ag_bits(x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

// Loads and stores with cache hints: plain accesses here, each one seen by the race and bounds checks.
template <class T>
static inline T __ldg(const T *p) { return *p; }
#define AG_LOAD(name) template <class T> static inline T name(const T *p) { return *p; }
#define AG_STORE(name) template <class T> static inline void name(T *p, T value) { *p = value; }
AG_LOAD(__ldcg) AG_LOAD(__ldca) AG_LOAD(__ldcs) AG_LOAD(__ldlu) AG_LOAD(__ldcv)
AG_STORE(__stcg) AG_STORE(__stcs) AG_STORE(__stwb) AG_STORE(__stwt)
#undef AG_LOAD
#undef AG_STORE
#if !__has_builtin(__builtin_assume)
#define __builtin_assume(condition) ((void)0)  // nvcc's hint to the optimiser; g++ has no such builtin
#endif
static inline void __nanosleep(unsigned int) {}
static inline void __trap() { std::abort(); }

// Vector types, aligned as on the GPU so vectorised loads keep their meaning.
#define AG_VEC2(T, name) struct __attribute__((aligned(2 * sizeof(T)))) name { T x, y; }; \
    static inline name make_##name(T x, T y) { return name{x, y}; }
#define AG_VEC4(T, name) struct __attribute__((aligned(4 * sizeof(T)))) name { T x, y, z, w; }; \
    static inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }
AG_VEC2(float, float2)
AG_VEC4(float, float4)
AG_VEC2(int, int2)
AG_VEC4(int, int4)
AG_VEC2(unsigned int, uint2)
AG_VEC4(unsigned int, uint4)
#undef AG_VEC2
#undef AG_VEC4
