// Every block adds its sum into g_out[0] with atomicAdd: correct, no race (atomics are ordered).
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float block_sum;
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    if (tid == 0) block_sum = 0.0f;
    __syncthreads();
    atomicAdd(&block_sum, i < n ? g_in[i] : 0.0f);
    __syncthreads();
    if (tid == 0) atomicAdd(&g_out[0], block_sum);
}
