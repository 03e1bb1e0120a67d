// max2d with the usual identity of a max, -CUDART_INF_F from math_constants.h, for the missing quadrants.
#include <math_constants.h>

__global__ void max2d(const float *g_in, float *g_out, unsigned int width, unsigned int height)
{
    unsigned int half_w = (width + 1) / 2, half_h = (height + 1) / 2;
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= half_w || y >= half_h) return;
    float m = -CUDART_INF_F;
    for (unsigned int dy = 0; dy < 2; ++dy) {
        for (unsigned int dx = 0; dx < 2; ++dx) {
            unsigned int xx = x + dx * half_w, yy = y + dy * half_h;
            if (xx < width && yy < height) m = fmaxf(m, g_in[(size_t)yy * width + xx]);
        }
    }
    g_out[(size_t)y * half_w + x] = m;
}
