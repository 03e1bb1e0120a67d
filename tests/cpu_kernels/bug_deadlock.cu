// Half of the warp waits at a barrier while the other half shuffles with the full mask.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    unsigned int tid = threadIdx.x;
    float v = tid < n ? g_in[tid] : 0.0f;
    if (tid < 16) {
        __syncthreads();
    } else {
        v += __shfl_down_sync(0xffffffff, v, 1);
    }
    if (tid == 0) g_out[blockIdx.x] = v;
}
