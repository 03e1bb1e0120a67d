// No tree: the block loads its slice into shared memory and thread 0 adds the values one by one.
// No bank conflicts (one thread, one word at a time), no divergence worth counting, right on every case.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    if (tid == 0) {
        float sum = 0.0f;
        for (unsigned int k = 0; k < blockDim.x; ++k) {
            sum += sdata[k];
        }
        g_out[blockIdx.x] = sum;
    }
}
