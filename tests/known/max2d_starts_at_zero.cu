// Known wrong (max2d): the running max starts at 0.0f instead of the first element (or -INFINITY), so a
// matrix whose values are all negative reduces to 0.
__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2;
    unsigned int half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) {
        return;
    }
    bool has_right = x + half_w < width;
    bool has_below = y + half_h < height;
    size_t row = (size_t)y * width;
    size_t row_below = (size_t)(y + half_h) * width;
    float m = 0.0f;
    m = fmaxf(m, g_in[row + x]);
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
