// Each lane writes what the warp collectives and shared atomics gave it, eight values per lane.
__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    __shared__ int counter;
    __shared__ int biggest;
    __shared__ unsigned int bits;
    unsigned int lane = threadIdx.x % 32;
    float v = g_in[threadIdx.x];
    if (threadIdx.x == 0) {
        counter = 0;
        biggest = -1;
        bits = 0;
    }
    __syncthreads();
    float *out = g_out + threadIdx.x * 9;
    out[0] = __shfl_sync(0xffffffff, v, 3);
    out[1] = __shfl_up_sync(0xffffffff, v, 1);
    out[2] = __shfl_down_sync(0xffffffff, v, 2, 16);
    out[3] = __shfl_xor_sync(0xffffffff, v, 1);
    out[4] = (float)__popc(__ballot_sync(0xffffffff, lane % 3 == 0));
    out[5] = __any_sync(0xffffffff, lane == 7) + 2 * __all_sync(0xffffffff, lane < 31);
    atomicAdd(&counter, 1);
    atomicMax(&biggest, (int)lane);
    atomicOr(&bits, 1u << lane);
    __syncthreads();
    out[6] = (float)counter;
    out[7] = (float)biggest;
    out[8] = (float)__popc(bits);
}
