// The style of the CUDA samples' reduction: a SharedMemory<T> helper around extern __shared__, a
// template<class T, unsigned int blockSize, bool nIsPow2> device function, a grid-stride loop, cooperative
// groups and cg::reduce for the last warp.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

template <class T>
struct SharedMemory {
    __device__ inline operator T *()
    {
        extern __shared__ int __smem[];
        return (T *)__smem;
    }
};

template <class T, unsigned int blockSize, bool nIsPow2>
__device__ void reduce6(const T *__restrict__ g_idata, T *__restrict__ g_odata, unsigned int n)
{
    cg::thread_block cta = cg::this_thread_block();
    T *sdata = SharedMemory<T>();
    unsigned int tid = threadIdx.x;
    unsigned int gridSize = blockSize * 2 * gridDim.x;
    T mySum = 0;
    if (nIsPow2) {
        unsigned int i = blockIdx.x * blockSize * 2 + threadIdx.x;
        while (i < n) {
            mySum += g_idata[i];
            if ((i + blockSize) < n) mySum += g_idata[i + blockSize];
            i += gridSize;
        }
    } else {
        unsigned int i = blockIdx.x * blockSize + threadIdx.x;
        while (i < n) {
            mySum += g_idata[i];
            i += blockSize * gridDim.x;
        }
    }
    sdata[tid] = mySum;
    cg::sync(cta);
    if ((blockSize >= 512) && (tid < 256)) sdata[tid] = mySum = mySum + sdata[tid + 256];
    cg::sync(cta);
    if ((blockSize >= 256) && (tid < 128)) sdata[tid] = mySum = mySum + sdata[tid + 128];
    cg::sync(cta);
    if ((blockSize >= 128) && (tid < 64)) sdata[tid] = mySum = mySum + sdata[tid + 64];
    cg::sync(cta);
    cg::thread_block_tile<32> tile32 = cg::tiled_partition<32>(cta);
    if (cta.thread_rank() < 32) {
        if (blockSize >= 64) mySum += sdata[tid + 32];
        mySum = cg::reduce(tile32, mySum, cg::plus<T>());
    }
    if (cta.thread_rank() == 0) g_odata[blockIdx.x] = mySum;
}

__global__ void reduce_open(const float *g_in, float *g_out, unsigned int n)
{
    if ((n & (n - 1)) == 0) {
        reduce6<float, 256, true>(g_in, g_out, n);
    } else {
        reduce6<float, 256, false>(g_in, g_out, n);
    }
}
