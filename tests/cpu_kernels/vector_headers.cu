// The open stage with the vector types named by their own headers: each thread gathers its sixteen elements,
// blockDim.x apart, four at a time into a float4 made with make_float4, then the block folds the sums.
#include <vector_types.h>
#include <vector_functions.h>

__global__ void reduce_open(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int base = blockIdx.x * 16 * blockDim.x + tid;
    float sum = 0.0f;
    for (unsigned int k = 0; k < 16; k += 4) {
        unsigned int i = base + k * blockDim.x;
        float4 v = make_float4(i < n ? g_in[i] : 0.0f,
                               i + blockDim.x < n ? g_in[i + blockDim.x] : 0.0f,
                               i + 2 * blockDim.x < n ? g_in[i + 2 * blockDim.x] : 0.0f,
                               i + 3 * blockDim.x < n ? g_in[i + 3 * blockDim.x] : 0.0f);
        sum += (v.x + v.y) + (v.z + v.w);
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
}
