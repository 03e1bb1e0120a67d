// Stage 5: the last warp unrolled, with __syncwarp() between its steps.
__device__ void warp_reduce(volatile float *sdata, unsigned int tid)
{
    float v = sdata[tid];
    v += sdata[tid + 32]; __syncwarp(); sdata[tid] = v; __syncwarp();
    v += sdata[tid + 16]; __syncwarp(); sdata[tid] = v; __syncwarp();
    v += sdata[tid + 8];  __syncwarp(); sdata[tid] = v; __syncwarp();
    v += sdata[tid + 4];  __syncwarp(); sdata[tid] = v; __syncwarp();
    v += sdata[tid + 2];  __syncwarp(); sdata[tid] = v; __syncwarp();
    v += sdata[tid + 1];  __syncwarp(); sdata[tid] = v;
}

__global__ void reduce_unrolled_warp(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (blockDim.x * 2) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid < 32) warp_reduce(sdata, tid);
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
