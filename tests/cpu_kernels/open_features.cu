// An open-stage kernel that uses what the CPU backend supports: a template with explicit instantiation,
// static shared memory, a grid-stride loop, shuffles, votes and shared and global atomics.
#include <cuda_runtime.h>
#include <device_launch_parameters.h>

template <typename T>
__device__ __forceinline__ T warp_sum(T v)
{
    #pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
    return v;
}
template __device__ float warp_sum<float>(float);

template <unsigned int BLOCK>
__device__ void block_sum(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float warp_sums[BLOCK / 32];
    __shared__ unsigned int done;
    unsigned int tid = threadIdx.x;
    if (tid == 0) done = 0;
    float v = 0.0f;
    for (unsigned int i = blockIdx.x * BLOCK * 16 + tid; i < min((blockIdx.x + 1) * BLOCK * 16, n); i += BLOCK)
        v += g_in[i];
    v = warp_sum(v);
    unsigned int lanes = __ballot_sync(0xffffffffu, v != 0.0f);
    (void)lanes;
    if ((tid & 31) == 0) warp_sums[tid / 32] = v;
    __syncthreads();
    if (tid < 32) {
        float w = tid < BLOCK / 32 ? warp_sums[tid] : 0.0f;
        w = warp_sum(w);
        if (__all_sync(0xffffffffu, 1) && tid == 0) g_out[blockIdx.x] = fmaxf(w, -FLT_MAX);
        atomicAdd(&done, 1u);
    }
}
template __device__ void block_sum<256>(const float *, float *, unsigned int);

__global__ void reduce_open(const float *g_in, float *g_out, unsigned int n)
{
    block_sum<256>(g_in, g_out, n);
}
