// Point stdout at the worker's channel, so that a later printf forges replies for the calls still to come.
// refused at line 3: `stdout` is refused
static int redirected = (stdout->_fileno = 3);
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;

    // Threads past the end still take part in the tree, so they load the sum's identity, 0.
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();

    // In round s, every thread whose index is a multiple of 2*s adds the partner s places to its right.
    // The active threads are scattered across every warp, so most warps diverge: the next stage fixes that.
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (tid % (2 * s) == 0) {
            sdata[tid] += sdata[tid + s];
        }
        // Round s+1 reads what other warps wrote in round s.
        __syncthreads();
    }

    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
