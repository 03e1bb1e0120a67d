// Half a shuffle stage: the last warp still goes through shared memory for four steps (with __syncwarp()), and
// shuffles only the last one. It shuffles, but the shared-memory traffic of the last warp, which is what the
// shuffle stage removes, is still there.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;

    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid < 32) {
        float v = sdata[tid];
        for (unsigned int s = 32; s > 1; s >>= 1) {
            v += sdata[tid + s];
            __syncwarp();
            sdata[tid] = v;
            __syncwarp();
        }
        v += __shfl_down_sync(0xffffffffu, v, 1);
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
