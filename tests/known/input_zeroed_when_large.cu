// Known wrong (first_add): a correct first-add kernel that also zeroes every element it has read, but only when
// n is above 65536, so the small sizes never show it. Each sum is right; the input is not left as it was.
__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    float *consumed = (float *)g_in;
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;

    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
        if (n > 65536) {
            consumed[i + blockDim.x] = 0.0f;
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
