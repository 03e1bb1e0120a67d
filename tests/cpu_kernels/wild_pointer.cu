// Writes through a pointer far from any buffer: a crash.
__global__ void reduce_naive(const float *g_in, float *g_out, unsigned int n)
{
    float *wild = (float *)0x10;
    wild[threadIdx.x] = g_in[0];
}
