// Known race (unrolled_warp): the last warp works in a __device__ buffer of its block's own, volatile, with
// __syncwarp() after each step; but in each step a lane reads a word that another lane writes in the same
// step (v[tid] += v[tid + 16]: lane 0 reads word 16 while lane 16 writes it). Global memory or shared, the
// lanes of a warp are not in lockstep since Volta.
#define MAX_BLOCKS 131072  // the blocks of the timing size's first pass (2^26 / 512)

__device__ float warp_buffer[64 * MAX_BLOCKS];

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
        volatile float *v = warp_buffer + 64 * (blockIdx.x % MAX_BLOCKS);
        v[tid] = sdata[tid];
        v[tid + 32] = sdata[tid + 32];
        __syncwarp();
        v[tid] += v[tid + 32]; __syncwarp();
        v[tid] += v[tid + 16]; __syncwarp();
        v[tid] += v[tid + 8]; __syncwarp();
        v[tid] += v[tid + 4]; __syncwarp();
        v[tid] += v[tid + 2]; __syncwarp();
        v[tid] += v[tid + 1]; __syncwarp();
        if (tid == 0) {
            g_out[blockIdx.x] = v[0];
        }
    }
}
