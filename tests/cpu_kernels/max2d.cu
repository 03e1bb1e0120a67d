// Stage 7: one step of the 2-D max by quadrants. Output (x, y) takes the max of input (x, y) and the
// elements one half-width right, one half-height down, and both.
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int out_w = (width + 1) / 2, out_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= out_w || y >= out_h) return;
    float m = g_in[y * width + x];
    if (x + out_w < width) m = fmaxf(m, g_in[y * width + x + out_w]);
    if (y + out_h < height) {
        m = fmaxf(m, g_in[(y + out_h) * width + x]);
        if (x + out_w < width) m = fmaxf(m, g_in[(y + out_h) * width + x + out_w]);
    }
    g_out[y * out_w + x] = m;
}
