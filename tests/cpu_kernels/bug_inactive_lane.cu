// Half the warp returns, the rest shuffles with the full mask and reads lanes that have exited.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    unsigned int tid = threadIdx.x;
    if (tid >= 16) return;
    float v = tid < n ? g_in[tid] : 0.0f;
    v += __shfl_down_sync(0xffffffff, v, 16);
    if (tid == 0) g_out[blockIdx.x] = v;
}
