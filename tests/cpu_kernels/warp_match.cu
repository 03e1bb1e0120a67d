// The shuffle stage done by warps alone: each warp adds its lanes' values with shuffles, asking on the way
// which lanes hold equal values (__match_any_sync, on unsigned and float values) and whether all do
// (__match_all_sync); a warp keeps its sum only where the answers are CUDA's. Lane 0 of each warp then adds
// the warp sums of its block through shared memory.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float warp_sums[];
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned int at = blockIdx.x * 2 * blockDim.x + threadIdx.x;
    float v = (at < n ? g_in[at] : 0.0f) + (at + blockDim.x < n ? g_in[at + blockDim.x] : 0.0f);
    int same = 0, differ = 1;
    const unsigned int all = __match_all_sync(0xffffffffu, 7u, &same);
    const unsigned int none = __match_all_sync(0xffffffffu, lane, &differ);
    const bool right = __match_any_sync(0xffffffffu, lane / 4) == 0xfu << (lane / 4 * 4)
                       && __match_any_sync(0xffffffffu, (float)(lane / 8)) == 0xffu << (lane / 8 * 8)
                       && all == 0xffffffffu && same && none == 0u && !differ;
    for (unsigned int step = 1; step < 32; step *= 2) v += __shfl_xor_sync(0xffffffffu, v, step);
    if (lane == 0) warp_sums[warp] = right ? v : -1.0e30f;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (unsigned int w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
        g_out[blockIdx.x] = total;
    }
}
