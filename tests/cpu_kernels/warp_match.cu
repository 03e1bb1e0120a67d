// The shuffle stage, its last warp also asking which lanes hold equal values (__match_any_sync, on unsigned and
// float values) and whether all do (__match_all_sync): the sum is kept only where the answers are CUDA's.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid < 32) {
        float v = sdata[tid] + sdata[tid + 32];
        unsigned int quads = __match_any_sync(0xffffffffu, tid / 4);
        unsigned int octets = __match_any_sync(0xffffffffu, (float)(tid / 8));
        int same = 0;
        unsigned int all = __match_all_sync(0xffffffffu, 7u, &same);
        int differ = 1;
        unsigned int none = __match_all_sync(0xffffffffu, tid, &differ);
        bool right = quads == 0xfu << (tid / 4 * 4) && octets == 0xffu << (tid / 8 * 8) && all == 0xffffffffu
                     && same && none == 0u && !differ;
        v = right ? v : -1.0e30f;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (tid == 0) g_out[blockIdx.x] = v;
    }
}
