// The same dodge with a block-wide barrier between the last warp's shared-memory steps (every thread reaches
// each one; the other warps only wait), and a token shared read by another warp in the last stretch.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    float token = (tid == 32) ? sdata[1] : 0.0f;
    float v = __shfl_down_sync(0xffffffffu, token, 1);
    if (tid == 0) g_out[blockIdx.x] = sdata[0] + 0.0f * v;
}
