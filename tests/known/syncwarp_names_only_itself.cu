// Known wrong (unrolled_warp): every __syncwarp names only its own lane (1u << tid), which is legal and orders
// nothing, so the last warp's steps race as if there were no __syncwarp at all.
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
        unsigned int me = 1u << (tid & 31);
        float v = sdata[tid] + sdata[tid + 32];
        __syncwarp(me); sdata[tid] = v; __syncwarp(me);
        v += sdata[tid + 16];
        __syncwarp(me); sdata[tid] = v; __syncwarp(me);
        v += sdata[tid + 8];
        __syncwarp(me); sdata[tid] = v; __syncwarp(me);
        v += sdata[tid + 4];
        __syncwarp(me); sdata[tid] = v; __syncwarp(me);
        v += sdata[tid + 2];
        __syncwarp(me); sdata[tid] = v; __syncwarp(me);
        v += sdata[tid + 1];
        if (tid == 0) g_out[blockIdx.x] = v;
    }
}
