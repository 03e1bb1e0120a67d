// Stage 5, unrolled last warp: the tree loop stops once 64 values are left; the first warp finishes alone,
// without __syncthreads and without loop overhead.
__global__ void reduce_unrolled_warp(const float *g_in, float *g_out, unsigned int n)
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

    // blockDim.x is at least 64, so sdata[0..63] holds the block's values when this loop ends.
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }

    if (tid < 32) {
        // Since sm_70 the lanes of a warp are not guaranteed to run in lockstep, so `volatile` alone is a
        // data race. Each step reads its partner into a register, waits for the whole warp (so every read is
        // done), writes, and waits again (so every write is visible before the next step reads it).
        float v = sdata[tid] + sdata[tid + 32];
        __syncwarp();
        sdata[tid] = v;
        __syncwarp();
        v += sdata[tid + 16];
        __syncwarp();
        sdata[tid] = v;
        __syncwarp();
        v += sdata[tid + 8];
        __syncwarp();
        sdata[tid] = v;
        __syncwarp();
        v += sdata[tid + 4];
        __syncwarp();
        sdata[tid] = v;
        __syncwarp();
        v += sdata[tid + 2];
        __syncwarp();
        sdata[tid] = v;
        __syncwarp();
        v += sdata[tid + 1];
        // Lane 0's register now holds the block's sum; nobody reads shared memory after this.
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
