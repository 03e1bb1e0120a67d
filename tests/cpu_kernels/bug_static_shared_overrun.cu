// A static shared array one element too short: thread 255 writes past its end.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float sdata[255];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    sdata[tid] = i < n ? g_in[i] : 0.0f;
    __syncthreads();
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
