// Textbook style: the dynamic shared array declared once at file scope, outside the kernel. It crashed in a
// fresh worker when its address was taken before the runtime had mapped shared memory.
extern __shared__ float sdata[];

__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
{
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        g_out[blockIdx.x] = sdata[0];
    }
}
