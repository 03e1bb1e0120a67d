// Stage 5 whose last warp drops __syncwarp (a race), but only in the blocks between the first and last 64 of a
// launch of more than 2^20 threads, which the CPU backend once ran unchecked. The lanes fold in reverse, so the
// run-until-blocked schedule still sums right: only the race check can tell.
__global__ void reduce_unrolled_warp(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + tid;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    bool middle = (unsigned long long)gridDim.x * blockDim.x > (1u << 20)
                  && blockIdx.x >= 64 && blockIdx.x < gridDim.x - 64;
    if (tid < 32) {
        if (middle) {
            volatile float *vs = sdata;
            unsigned int r = 31 - tid;
            for (unsigned int s = 32; s > 0; s >>= 1) {
                if (r < s) vs[r] += vs[r + s];
            }
            if (r == 0) g_out[blockIdx.x] = vs[0];
            return;
        }
        float v = sdata[tid] + sdata[tid + 32];
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
        if (tid == 0) g_out[blockIdx.x] = v;
    }
}
