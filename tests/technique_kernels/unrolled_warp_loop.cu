// Another way to unroll the last warp: a loop over the last six steps with __syncwarp() between them, which nvcc
// unrolls (its trip count is known). No __syncthreads() in it: the technique of stage 5.
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
        float v = sdata[tid];
        for (unsigned int s = 32; s > 0; s >>= 1) {
            v += sdata[tid + s];
            __syncwarp();
            sdata[tid] = v;
            __syncwarp();
        }
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
