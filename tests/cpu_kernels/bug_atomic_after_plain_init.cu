// Block 0 zeroes the accumulator with a plain store, then every block adds into it atomically. Nothing orders
// block 0's store before the other blocks' atomics: on a GPU a block that runs first loses its sum.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x == 0 && tid == 0) g_out[0] = 0.0f;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) atomicAdd(&g_out[0], sdata[0]);
}
