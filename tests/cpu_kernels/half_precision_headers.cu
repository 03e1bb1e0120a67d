// cuda_fp16.h and cuda_bf16.h: conversions that round to nearest even, arithmetic and __half2 lanes. A result
// that is not what a GPU gives spoils the sum.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float warp_sums[32];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + tid;
    float sum = i < n ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    __half2 pair = __floats2half2_rn(1.5f, 2049.0f);
    bool same = __half2float(__hadd(__low2half(pair), __float2half(0.25f))) == 1.75f &&
                __high2float(pair) == 2048.0f && __bfloat162float(__float2bfloat16(257.0f)) == 256.0f &&
                __bfloat162float(__hmul(__float2bfloat16(3.0f), __float2bfloat16(-2.0f))) == -6.0f &&
                __half2float(__hmax(__float2half(0.5f), __float2half(-1.0f))) == 0.5f;
    if (!same) sum = __int_as_float(0x7fc00000);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (tid % 32 == 0) warp_sums[tid / 32] = sum;
    __syncthreads();
    if (tid < 32) {
        float v = tid < blockDim.x / 32 ? warp_sums[tid] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (tid == 0) g_out[blockIdx.x] = v;
    }
}
