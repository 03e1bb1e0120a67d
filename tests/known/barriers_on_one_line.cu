// Known wrong (sequential): the two branches of a divergent if each hold a __syncthreads(), written on one line.
// Two barriers, each reached by part of the block: undefined, however the line reads.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) { sdata[tid] += sdata[tid + s]; __syncthreads(); } else { __syncthreads(); }
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
