// Block 0 looks at the accumulator with a plain read before adding to it, while the other blocks add to it
// atomically: the read races with their atomics.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) {
        if (blockIdx.x == 0 && g_out[0] != g_out[0]) sdata[1] = 0.0f;
        atomicAdd(&g_out[0], sdata[0]);
    }
}
