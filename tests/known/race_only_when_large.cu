// Known race (unrolled_warp), kept to sizes above the fixed ones the analysis runs: above 65 536 values the last
// warp runs the textbook's `volatile` steps with no __syncwarp() between them (a race since sm_70: the lanes need
// not run in lockstep), and below it the synchronised steps. A GPU run's race analysis must see the sizes drawn
// from the run's seed too, or it would grade the kernel by its safe half (and the CPU backend, which analyses every
// case, would not: one hand-in, two verdicts).
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
    for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid < 32) {
        if (n > 65536) {
            volatile float *v = sdata;
            v[tid] += v[tid + 32];
            v[tid] += v[tid + 16];
            v[tid] += v[tid + 8];
            v[tid] += v[tid + 4];
            v[tid] += v[tid + 2];
            v[tid] += v[tid + 1];
        } else {
            for (unsigned int s = 32; s > 0; s >>= 1) {
                float v = sdata[tid] + sdata[tid + s];
                __syncwarp();
                sdata[tid] = v;
                __syncwarp();
            }
        }
        if (tid == 0) {
            g_out[blockIdx.x] = sdata[0];
        }
    }
}
