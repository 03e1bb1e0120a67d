__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    sdata[tid] = g_in[tid] + undeclared_value;
    __syncthreads();
    float v = __shfl_down_sync(0xffffffff, sdata, 1, 32, 7);
}
