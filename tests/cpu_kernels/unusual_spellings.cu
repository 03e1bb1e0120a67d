// Spellings nvcc accepts that a course rarely sees: digraph braces, an attribute on a shared array, a digit
// separator in a static shared array's size.
__global__ void reduce_sequential(const float *g_in, float *g_out, unsigned int n)
<%
    [[maybe_unused]] extern __shared__ float unused_dynamic[];
    __shared__ float sdata[1'024];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[tid] = (i < n) ? g_in[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) <%
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    %>
    if (tid == 0) g_out[blockIdx.x] = sdata[0];
%>
