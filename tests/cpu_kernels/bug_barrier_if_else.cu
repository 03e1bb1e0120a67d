// Two different barriers, one in each branch: half of the block waits at one, half at the other.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tid < blockDim.x / 2) {
        sdata[tid] = (i < n) ? g_in[i] : 0.0f;
        __syncthreads();
    } else {
        sdata[tid] = (i < n) ? g_in[i] : 0.0f;
        __syncthreads();
    }
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
