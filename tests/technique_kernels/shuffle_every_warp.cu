// Another shuffle stage: every warp sums its lanes with shuffles, the warp sums meet in shared memory, and the
// first warp sums them with shuffles again. One __syncthreads(), and no shared-memory steps in the last warp.
__device__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;

    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sum = warp_sum(sum);
    if (tid % 32 == 0) {
        sdata[tid / 32] = sum;
    }
    __syncthreads();
    if (tid < 32) {
        sum = warp_sum(tid < blockDim.x / 32 ? sdata[tid] : 0.0f);
        if (tid == 0) {
            g_out[blockIdx.x] = sum;
        }
    }
}
