// Shared memory declared at namespace scope, templates (a kernel too) with explicit instantiation, and a
// two-dimensional static shared array.
#define TILE 8
__shared__ float partial[256];
__shared__ float tile[TILE][32];

template <unsigned int BLOCK>
__device__ void sum_block(const float *g_in, float *g_out, unsigned int n)
{
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * BLOCK + tid;
    partial[tid] = i < n ? g_in[i] : 0.0f;
    tile[tid / 32][tid % 32] = partial[tid];
    __syncthreads();
    for (unsigned int s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) partial[tid] += partial[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = partial[0] + 0.0f * tile[0][0];
}
template __device__ void sum_block<256>(const float *, float *, unsigned int);

template <int VALUE>
__global__ void fill_value(float *out)
{
    out[threadIdx.x] = VALUE;
}
template __global__ void fill_value<3>(float *);

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    sum_block<256>(g_in, g_out, n);
}
