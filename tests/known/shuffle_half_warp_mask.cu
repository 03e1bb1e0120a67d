// Known wrong (shuffle): only lanes 0-15 execute a shuffle whose full mask names all 32 lanes. Lanes 16-31 never
// arrive, so what lanes 0-15 read from them is undefined.
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
    for (unsigned int s = blockDim.x / 2; s > 16; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid < 16) {
        float v = sdata[tid] + sdata[tid + 16];
        for (int offset = 8; offset > 0; offset >>= 1) {
            v += __shfl_down_sync(0xffffffffu, v, offset);
        }
        if (tid == 0) {
            g_out[blockIdx.x] = v;
        }
    }
}
