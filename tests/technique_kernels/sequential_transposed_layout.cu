// Sequential addressing, but each value lives at a transposed place in shared memory: value t at
// (t % 32) * (blockDim.x / 32) + t / 32. The sum is right, yet the 32 lanes of a warp fall into a few banks only:
// the bank conflicts that sequential addressing exists to remove are back.
__device__ unsigned int place(unsigned int t)
{
    return (t % 32) * (blockDim.x / 32) + t / 32;
}

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;

    sdata[place(tid)] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[place(tid)] += sdata[place(tid + s)];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[place(0)];
    }
}
