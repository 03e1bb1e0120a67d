// Known wrong (max2d): the quadrant max is right, but each thread also stores it back into the input at (x, y),
// the one element of the top-left quadrant that only it reads. Every max comes out right; the input changes.
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2;
    unsigned int half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) {
        return;
    }
    size_t row = (size_t)y * width;
    size_t row_below = (size_t)(y + half_h) * width;
    float m = g_in[row + x];
    if (x + half_w < width) {
        m = fmaxf(m, g_in[row + x + half_w]);
    }
    if (y + half_h < height) {
        m = fmaxf(m, g_in[row_below + x]);
        if (x + half_w < width) {
            m = fmaxf(m, g_in[row_below + x + half_w]);
        }
    }
    ((float *)g_in)[row + x] = m;
    g_out[(size_t)y * half_w + x] = m;
}
