// Known hang (sequential): before writing its sum, block b spins until block b+1 (the last block: block 0)
// has raised its flag, and raises its own only afterwards. The waits form a cycle, so no block ever leaves
// its loop, whatever order the blocks run in. Blocks of one launch must never wait for each other.
#define FLAGS 4096

__device__ volatile int raised[FLAGS];

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        unsigned int next = (blockIdx.x + 1) % gridDim.x;
        while (raised[next % FLAGS] == 0) {
        }
        g_out[blockIdx.x] = sdata[0];
        raised[blockIdx.x % FLAGS] = 1;
    }
}
