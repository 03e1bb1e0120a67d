// Known wrong (sequential): every block does a plain read-modify-write of g_out[0]. Blocks that run at the
// same time lose each other's updates, and the other outputs stay poisoned. A race-checking backend that runs
// blocks one at a time still sees the race between blocks.
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
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[0] += sdata[0];
    }
}
