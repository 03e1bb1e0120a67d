// Block 0 walks the whole input, 256 elements apart, and every other block writes 0: the final sum is right,
// no block's partial sum is its own slice's.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    float sum = 0.0f;
    if (blockIdx.x == 0) {
        for (unsigned int i = tid; i < n; i += blockDim.x) {
            sum += g_in[i];
        }
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
        g_out[blockIdx.x] = sdata[0];
    }
}
