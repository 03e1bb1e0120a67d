// Known wrong (sequential): right only on the sizes the README publishes (and the sizes of their later passes);
// on any other n it drops the last element. A kernel that detects the test sizes, as cheats on kernel
// leaderboards do: the sizes drawn from each run's secret seed catch it.
__device__ bool published(unsigned int n)
{
    const unsigned int sizes[] = {1, 2, 3, 4, 16, 31, 32, 33, 65, 255, 256, 257, 511, 512, 513, 1000, 3907,
                                  16385, 65535, 65536, 1000003, 4194381};
    for (unsigned int k = 0; k < sizeof(sizes) / sizeof(sizes[0]); ++k) {
        if (sizes[k] == n) {
            return true;
        }
    }
    return false;
}

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int counted = published(n) ? n : n - 1;

    sdata[tid] = (i < counted) ? g_in[i] : 0.0f;
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
