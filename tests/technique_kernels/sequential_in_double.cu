// Sequential addressing on a double shared array (a student summing in double precision): consecutive lanes
// read consecutive 8-byte words. A GPU serves such a request in two half-warp phases of 128 bytes, each from 32
// banks without a conflict (Nsight Compute counts no bank conflict for it on an H200): the technique is there.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ double sdata[1024];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = (float)sdata[0];
    }
}
