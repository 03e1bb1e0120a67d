// Each block sums its slice moved one element to the right, and block 0 adds element 0 as well: every element
// is added once, so the final sum is right, but each block's partial sum gains its neighbour's first element
// and loses its own.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid + 1;
    float first = (blockIdx.x == 0 && tid == 0) ? g_in[0] : 0.0f;
    sdata[tid] = ((i < n) ? g_in[i] : 0.0f) + first;
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
