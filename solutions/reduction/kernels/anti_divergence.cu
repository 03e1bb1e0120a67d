// Stage 2, anti-divergence: the same interleaved tree as stage 1, but thread tid works on element 2*s*tid,
// so the threads doing work in a round are the first ones of the block and whole warps stay idle together.
__global__ void reduce_anti_divergence(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;

    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();

    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        // Contiguous threads, but 2*s words apart: several lanes of a warp now hit the same shared-memory bank
        // and wait for each other (a bank conflict), which the next stage removes.
        unsigned int index = 2 * s * tid;
        if (index < blockDim.x) {
            sdata[index] += sdata[index + s];
        }
        __syncthreads();
    }

    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
