// Stage 7, 2-D max by quadrants: one step turns a width x height matrix into a ceil(width/2) x ceil(height/2)
// one. Output element (x, y) is the max of the element at (x, y) in each of the four quadrants.
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2;
    unsigned int half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;

    // The grid is rounded up to whole blocks, so some threads have no output element.
    if (x >= half_w || y >= half_h) {
        return;
    }

    // With an odd side the right (or lower) quadrant is one shorter: its missing elements are skipped.
    // Neighbouring threads read neighbouring words in all four quadrants, so every load is coalesced.
    bool has_right = x + half_w < width;
    bool has_below = y + half_h < height;
    size_t row = (size_t)y * width;
    size_t row_below = (size_t)(y + half_h) * width;

    float m = g_in[row + x];
    if (has_right) {
        m = fmaxf(m, g_in[row + x + half_w]);
    }
    if (has_below) {
        m = fmaxf(m, g_in[row_below + x]);
    }
    if (has_right && has_below) {
        m = fmaxf(m, g_in[row_below + x + half_w]);
    }
    g_out[(size_t)y * half_w + x] = m;
}
