// The last warp's steps separated by __syncthreads() instead of __syncwarp(): only 32 threads reach it.
__global__ void reduce_unrolled_warp(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid < 32) {
        for (unsigned int s = 32; s > 0; s >>= 1) {
            if (tid < s) sdata[tid] += sdata[tid + s];
            __syncthreads();
        }
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
