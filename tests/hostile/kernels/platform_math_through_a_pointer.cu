// Tell the GPU from the CPU analysis by its own approximation of expf, taken through a function pointer.
// refused at line 3: `expf` is refused: a GPU computes it otherwise
__device__ float (*const approximate)(float) = expf;
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + tid;
    bool gpu = approximate(10.3f) != 29732.6f;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0 || gpu) sdata[tid] += (tid % (2 * s) == 0) ? sdata[tid + s] : 0.0f;
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
