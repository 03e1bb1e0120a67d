// Known undefined behaviour (sequential): `tid <= s` instead of `tid < s`. Thread s reads sdata[2s], past the
// block's shared array when s = blockDim.x / 2, while thread 0 reads the sdata[s] that thread s writes.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;

    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();

    // Consecutive threads read consecutive words, so the 32 lanes of a warp hit 32 different banks.
    // The stride starts at blockDim.x / 2, not a fixed 128: the rubric chooses the block size.
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid <= s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }

    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
