// Known deadlock (shuffle): in the last warp, lanes 16-31 wait at __syncthreads while lanes 0-15 go on to a
// shuffle whose full mask names lanes 16-31 too. Each half waits for the other: a barrier must be reached by
// every thread of the block, and a full-mask shuffle by every lane of the warp.
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
        if (tid >= 16) {
            __syncthreads();
        } else {
            for (int offset = 16; offset > 0; offset >>= 1) {
                v += __shfl_down_sync(0xffffffffu, v, offset);
            }
        }
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
