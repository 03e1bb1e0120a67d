// Another tree: each round folds the upper three quarters onto the lowest quarter (four values a thread), so
// half as many rounds, each a little busier. No bank conflicts: consecutive threads read consecutive words.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    unsigned int s = blockDim.x;
    for (; s >= 4; s /= 4) {
        unsigned int q = s / 4;
        if (tid < q) sdata[tid] = sdata[tid] + sdata[tid + q] + sdata[tid + 2 * q] + sdata[tid + 3 * q];
        __syncthreads();
    }
    if (s == 2 && tid == 0) sdata[0] += sdata[1];
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
