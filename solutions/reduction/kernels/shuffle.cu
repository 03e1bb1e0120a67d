// Stage 6, warp shuffle: as stage 5, but the last warp passes its partial sums from register to register
// with __shfl_down_sync instead of going through shared memory.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;

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
        // All 32 lanes are inside this branch, so the full mask is correct. Each shuffle also synchronises
        // the lanes it names: no __syncwarp is needed.
        for (int offset = 16; offset > 0; offset >>= 1) {
            v += __shfl_down_sync(0xffffffffu, v, offset);
        }
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
