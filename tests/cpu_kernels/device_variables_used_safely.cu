// A first_add kernel, correct though unusual: __device__ and __constant__ variables, and a function's statics (in
// global memory too), used without a race. A constant scale and a static table every thread reads; a slot per
// block that only its own thread 0 writes and reads back. Checking the accesses to such variables must not make such
// a kernel wrong. (A counter that carries over from launch to launch is kept state: tests/test_cpu_backend.py.)
#define SLOTS 65536

__constant__ float scale = 1.0f;
__device__ float block_sums[SLOTS];

__global__ void reduce_first_add(const float *g_in, float *g_out, unsigned int n)
{
    static const float halves[2] = {0.5f, 0.5f};
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2 * blockDim.x) + threadIdx.x;
    float sum = (i < n) ? g_in[i] : 0.0f;
    if (i + blockDim.x < n) {
        sum += g_in[i + blockDim.x];
    }
    sdata[tid] = sum * scale * (halves[0] + halves[1]);
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) {
        unsigned int slot = blockIdx.x % SLOTS;
        block_sums[slot] = sdata[0];
        g_out[blockIdx.x] = block_sums[slot];
    }
}
