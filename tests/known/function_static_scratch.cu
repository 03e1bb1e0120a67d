// Known race (anti_divergence): the tree runs in a function's `static` array instead of shared memory. On a GPU
// such a static lives in global memory, one array for every block of the launch (nvcc accepts it; the PTX holds
// one .global array), so blocks that run at the same time overwrite each other's partial sums. The CPU backend
// runs blocks one after another and sums right; a race checker must see the blocks share the words.
__global__ void reduce_anti_divergence(const float *g_in, float *g_out, unsigned int n)
{
    static float scratch[1024];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    scratch[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        unsigned int index = 2 * s * tid;
        if (index < blockDim.x) {
            scratch[index] += scratch[index + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = scratch[0];
    }
}
