// The first add another way: each thread adds two neighbours of its block's slice (the loads are less
// coalesced), and the block waits once more before thread 0 writes. One tree: log2(blockDim.x) + 2 barriers.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + 2 * tid;
    sdata[tid] = ((i < n) ? g_in[i] : 0.0f) + ((i + 1 < n) ? g_in[i + 1] : 0.0f);
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    __syncthreads();
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
