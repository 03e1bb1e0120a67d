// Known wrong (first_add): block 0 zeroes g_out[0] with a plain store and every block then adds its sum there
// with atomicAdd. Nothing orders block 0's store before the other blocks' atomics, and the other blocks leave
// their own g_out[b] unwritten.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    if (blockIdx.x == 0 && tid == 0) {
        g_out[0] = 0.0f;
    }
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        atomicAdd(&g_out[0], sdata[0]);
    }
}
