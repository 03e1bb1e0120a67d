// Warp-level intrinsics and the usual headers: warpSize, __activemask, __reduce_add_sync, __shfl_down_sync,
// atomicMax on an int, __int_as_float / __float_as_int, fmaxf, <cfloat>, <climits> and <cstdint>.
#include <cfloat>
#include <climits>
#include <cstdint>

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float warp_sums[32];
    __shared__ int last_warp;
    unsigned int tid = threadIdx.x, lane = tid % warpSize, warp = tid / warpSize;
    uint32_t i = blockIdx.x * (2 * blockDim.x) + tid;
    if (tid == 0) last_warp = INT_MIN;
    __syncthreads();
    float sum = 0.0f;
    if (i < n) sum += g_in[i];
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    unsigned int lanes = __reduce_add_sync(__activemask(), 1u);
    for (int offset = warpSize / 2; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
        // A NaN spoils the sum if the warp does not count 32 lanes.
        warp_sums[warp] = lanes == (unsigned int)warpSize ? sum : __int_as_float(0x7fc00000);
        atomicMax(&last_warp, (int)warp);
    }
    __syncthreads();
    if (warp == 0) {
        float v = lane <= (unsigned int)last_warp ? warp_sums[lane] : 0.0f;
        for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
        float bits = __int_as_float(__float_as_int(v));
        if (lane == 0) g_out[blockIdx.x] = fmaxf(bits, -FLT_MAX);
    }
}
