// Known wrong (sequential): the tree runs in place on the input, with const cast away, instead of in shared
// memory. Every sum comes out right, but g_in is left holding partial sums: reducing the same input again (as
// the timed calls on a GPU do) gives another result. The input must stay unchanged.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    float *data = const_cast<float *>(g_in);
    unsigned int tid = threadIdx.x;
    unsigned int base = blockIdx.x * blockDim.x;
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s && base + tid + s < n) {
            data[base + tid] += data[base + tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = data[base];
    }
}
