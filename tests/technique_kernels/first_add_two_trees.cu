// Not the first add: each thread loads one element and the block folds it, then loads the element blockDim.x
// later and folds again; thread 0 adds the two sums. Right on every case, and two trees a block.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + tid;
    float first = 0.0f;
    for (unsigned int half = 0; half < 2; ++half) {
        unsigned int at = i + half * blockDim.x;
        sdata[tid] = (at < n) ? g_in[at] : 0.0f;
        __syncthreads();
        for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                sdata[tid] += sdata[tid + s];
            }
            __syncthreads();
        }
        if (tid == 0) {
            first += sdata[0];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = first;
    }
}
