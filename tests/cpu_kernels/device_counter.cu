// A __device__ counter hands out tickets; the block that draws the last one writes the block count.
__device__ unsigned int blocks_done = 0;

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    if (threadIdx.x == 0) {
        unsigned int ticket = atomicInc(&blocks_done, gridDim.x - 1);
        if (ticket == gridDim.x - 1) g_out[0] = (float)gridDim.x;
    }
}
