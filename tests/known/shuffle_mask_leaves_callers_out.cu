// Known wrong (shuffle): all 32 lanes call __shfl_sync with the mask 0x0000ffff, reading lanes 0-15 only. Lanes
// 16-31 leave themselves out of their own mask, which CUDA leaves undefined.
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
        v += __shfl_down_sync(0xffffffffu, v, 16);
        for (int off = 8; off > 0; off >>= 1)
            v += __shfl_sync(0x0000ffffu, v, (tid + off) & 15);
        if (tid == 0) g_out[blockIdx.x] = v;
    }
}
