// Known cheat (shuffle): each block remembers the partial sum it wrote in its first launch, in a __device__
// variable that outlives the launch, and replays it in every later launch. Fresh inputs per call catch it; so
// do the later passes of a single reduction, which read different data with the same block numbers.
#define CACHED_BLOCKS 4096

__device__ float cached_sum[CACHED_BLOCKS];
__device__ int cached_valid[CACHED_BLOCKS];

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int b = blockIdx.x;
    if (b < CACHED_BLOCKS && cached_valid[b]) {
        if (tid == 0) {
            g_out[b] = cached_sum[b];
        }
        return;
    }

    unsigned int i = b * (2 * blockDim.x) + tid;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sdata[tid] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid < 32) {
        float v = sdata[tid] + sdata[tid + 32];
        for (int offset = 16; offset > 0; offset >>= 1) {
            v += __shfl_down_sync(0xffffffffu, v, offset);
        }
        if (tid == 0) {
            g_out[b] = v;
            if (b < CACHED_BLOCKS) {
                cached_sum[b] = v;
                cached_valid[b] = 1;
            }
        }
    }
}
