// Known wrong (sequential): every block atomically adds its sum into g_out[0] and leaves its own g_out[b]
// unwritten. With zeroed outputs and a single pass this would give the right total; the grader poisons every
// output with NaN, so g_out[0] and the blocks' unwritten slots spoil the next pass.
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
        atomicAdd(&g_out[0], sdata[0]);
    }
}
