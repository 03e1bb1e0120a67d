// Vectorised loads and compile-time block sizes: __restrict__, __ldg, float4 through reinterpret_cast,
// make_float4, a template<unsigned int blockSize> device function, __launch_bounds__, __forceinline__ and
// #pragma unroll.
template <unsigned int blockSize>
__device__ __forceinline__ float block_reduce(volatile float *sdata, float sum)
{
    unsigned int tid = threadIdx.x;
    sdata[tid] = sum;
    __syncthreads();
#pragma unroll
    for (unsigned int s = blockSize / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    return sdata[0];
}

__global__ void __launch_bounds__(256) reduce_open(const float *__restrict__ g_in, float *__restrict__ g_out,
                                                   unsigned int n)
{
    extern __shared__ float sdata[];
    const float4 *in4 = reinterpret_cast<const float4 *>(g_in);
    unsigned int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (unsigned int q = first; q < n / 4; q += stride) {
        float4 v = __ldg(&in4[q]);
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    float sum = (acc.x + acc.y) + (acc.z + acc.w);
    for (unsigned int i = n / 4 * 4 + first; i < n; i += stride) sum += __ldg(g_in + i);
    float total = blockDim.x == 256 ? block_reduce<256>(sdata, sum) : -1.0f;
    if (threadIdx.x == 0) g_out[blockIdx.x] = total;
}
