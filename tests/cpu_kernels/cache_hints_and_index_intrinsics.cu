// first add during load, written with intrinsics of older tutorials and of the CUDA C guide: 24-bit index
// products, loads and stores with cache hints, a funnel shift, the round-to-nearest float operations and an
// assumption for the optimiser.
__global__ void reduce_first_add(const float *__restrict__ g_in, float *__restrict__ g_out, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    __builtin_assume(blockDim.x >= 32);
    unsigned int i = __umul24(blockIdx.x, blockDim.x * 2) + tid;
    int signed_index = __mul24((int)blockIdx.x, (int)blockDim.x * 2) + (int)tid;
    unsigned int one = __funnelshift_l(0u, 1u, 0u) + __funnelshift_r(2u, 0u, 1u) - 1u;  // 1 + 1 - 1
    float sum = (i < n) ? __ldcg(&g_in[signed_index]) : 0.0f;
    if (i + blockDim.x < n) sum = __fadd_rn(sum, __ldcs(&g_in[i + blockDim.x * one]));
    sdata[tid] = __fmul_rn(sum, __uint2float_rn(one));
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] = __fsub_rn(sdata[tid], -sdata[tid + s]);
        __syncthreads();
    }
    if (tid == 0) __stcg(&g_out[blockIdx.x], sdata[0]);
}
