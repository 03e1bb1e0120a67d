// A shared counter zeroed by thread 0 and ordered with __syncwarp() only: the atomics of the other warps race
// with the plain store.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ float total;
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + tid;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) sum += g_in[i + blockDim.x];
    if (tid == 0) total = 0.0f;
    __syncwarp();
    atomicAdd(&total, sum);
    __syncthreads();
    if (tid == 0) g_out[blockIdx.x] = total;
}
