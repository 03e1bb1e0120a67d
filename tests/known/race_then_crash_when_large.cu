// Known undefined behaviour (sequential): the tree loop has no barrier (a race), and thread 0 of every block also
// stores far past the output buffer (2^36 floats on) once n passes a million, where no allocation lies.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
    }
    if (tid == 0) {
        if (n > 1000000) {
            g_out[((size_t)1 << 36) + blockIdx.x] = sdata[0];
        }
        g_out[blockIdx.x] = sdata[0];
    }
}
