// Known out-of-bounds write (naive): block 0 keeps a copy of its values in a __device__ array one word too
// short, so its last thread writes past the array's end. The sum is right; the write is undefined behaviour.
namespace keep {
__device__ float first_block[255];
}

__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    if (blockIdx.x == 0) {
        keep::first_block[tid] = sdata[tid];
    }
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
