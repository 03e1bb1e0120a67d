// A loop with a barrier inside whose trip count differs between threads: threads whose loop ends early leave
// the others waiting at a barrier they never reach again.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    float sum = 0.0f;
    for (unsigned int i = blockIdx.x * 2 * blockDim.x + tid; i < min(n, (blockIdx.x + 1) * 2 * blockDim.x);
         i += blockDim.x) {
        sum += g_in[i];
        __syncthreads();
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
