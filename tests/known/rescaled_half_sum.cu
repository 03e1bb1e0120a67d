// Known cheat (first_add): each thread loads only the first of its two elements and doubles it, reading half
// the memory. The result is close for smooth random data but wrong for exact integer inputs.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    sdata[tid] = (i < n) ? 2.0f * g_in[i] : 0.0f;
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
