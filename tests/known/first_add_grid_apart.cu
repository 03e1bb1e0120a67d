// Each thread adds its element and the one a whole grid later (gridDim.x * blockDim.x apart), not the one
// blockDim.x later in its block's own slice: every element is added once and the final sum is right, but
// block b sums two pieces of the input that are not its slice.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    unsigned int j = i + gridDim.x * blockDim.x;
    sdata[tid] = ((i < n) ? g_in[i] : 0.0f) + ((j < n) ? g_in[j] : 0.0f);
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
