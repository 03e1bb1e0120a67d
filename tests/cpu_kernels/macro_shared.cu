// Shared memory declared through macros: the declarations exist only after preprocessing.
#define SMEM extern __shared__ float
#define DECL(x) __shared__ float x[256]
#define SHARED_ARRAY(type, name, count) \
    __shared__ type name[count]

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    SMEM sdata[];
    DECL(copy);
    SHARED_ARRAY(unsigned int, seen, 1);
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (tid == 0) seen[0] = 0;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid < 256) copy[tid] = sdata[0];
    atomicAdd(&seen[0], 1u);
    __syncthreads();
    if (tid == 0) g_out[blockIdx.x] = seen[0] == blockDim.x ? copy[blockDim.x - 1] : -1.0f;
}
