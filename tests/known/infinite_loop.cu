// Known hang (naive): thread 0 of the last block never leaves its loop, so the launch never finishes.
// The grader must stop it with a time limit, not wait forever.
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tid == 0 && blockIdx.x == gridDim.x - 1) {
        while (true) {
        }
    }
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
