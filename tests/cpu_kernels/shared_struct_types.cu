// sequential addressing whose block result passes through shared variables of struct types defined in their
// own declarations: an unnamed struct (with two members on one declarator list) and a named one, as an array.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n) {
    extern __shared__ float sdata[];
    __shared__ struct { float partial, spare; unsigned int count; } result;
    __shared__ struct Slot { float value; int owner; } slots[2];
    const unsigned int tid = threadIdx.x, first = blockIdx.x * blockDim.x;
    sdata[tid] = first + tid < n ? g_in[first + tid] : 0.0f;
    __syncthreads();
    unsigned int half = blockDim.x;
    while ((half /= 2) > 0) {
        if (tid < half) sdata[tid] = sdata[tid] + sdata[half + tid];
        __syncthreads();
    }
    if (tid == 0) {
        result.partial = sdata[0];
        result.count = 1;
        slots[1].value = result.partial * result.count;
        slots[1].owner = 0;
    }
    __syncthreads();
    if (tid == 0) g_out[blockIdx.x] = slots[1].value;
}
