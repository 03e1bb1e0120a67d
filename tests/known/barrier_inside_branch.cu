// Known wrong (sequential): the tree's __syncthreads() sits inside `if (tid < s)`, so only part of the block
// reaches it. The sum comes out right on a GPU, which counts exited threads as arrived, but CUDA leaves a
// barrier in code that the block does not run alike undefined.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
            __syncthreads();
        }
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
