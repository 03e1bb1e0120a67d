// The baseline for max2d's speedup: output element (x, y) is the max of the 2x2 block of neighbours at
// (2x, 2y). It gives the same overall max as the quadrant kernel, but each load of a warp reads every other
// word, so each memory transaction is only half used by it; the quadrant kernel's loads are contiguous.
// Where the cache keeps the other half for the neighbouring load (an H200 does), the two run at about the
// same speed.
__global__ void max2d_baseline(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int out_w = (width + 1) / 2;
    unsigned int out_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= out_w || y >= out_h) {
        return;
    }

    unsigned int x0 = 2 * x;
    unsigned int y0 = 2 * y;
    // On an odd side the last block of neighbours is cut short: skip what lies outside the matrix.
    bool has_right = x0 + 1 < width;
    bool has_below = y0 + 1 < height;
    size_t row = (size_t)y0 * width;
    size_t row_below = row + width;

    float m = g_in[row + x0];
    if (has_right) {
        m = fmaxf(m, g_in[row + x0 + 1]);
    }
    if (has_below) {
        m = fmaxf(m, g_in[row_below + x0]);
    }
    if (has_right && has_below) {
        m = fmaxf(m, g_in[row_below + x0 + 1]);
    }
    g_out[(size_t)y * out_w + x] = m;
}
