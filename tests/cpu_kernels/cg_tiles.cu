// Cooperative groups: the grid and the block, tiles of 32, 16 and 8 threads, their shuffles and votes, a
// thread_group, and cg::reduce.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

__global__ void reduce_shuffle(const float *g_in, float *g_out, unsigned int n)
{
    extern __shared__ float warp_sums[];
    cg::grid_group grid = cg::this_grid();
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    float sum = 0.0f;
    for (unsigned long long i = grid.thread_rank(); i < n; i += grid.size()) {
        sum += g_in[i];
    }
    // Half tiles first, by hand, then the whole tile with cg::reduce.
    cg::thread_block_tile<16> half = cg::tiled_partition<16>(block);
    for (unsigned int offset = half.size() / 2; offset > 0; offset /= 2) {
        sum += half.shfl_xor(sum, offset);
    }
    half.sync();
    if (half.thread_rank() != 0) sum = 0.0f;
    sum = cg::reduce(tile, sum, cg::plus<float>());
    // Votes and a dynamic tile: anything but what CUDA gives spoils the sum.
    auto eighth = cg::tiled_partition<8>(block);
    bool votes = eighth.ballot(eighth.thread_rank() & 1) == 0xaau && eighth.any(eighth.thread_rank() == 7) &&
                 !eighth.all(eighth.thread_rank() < 7) && eighth.shfl_up(eighth.thread_rank(), 1) + 1 ==
                 (eighth.thread_rank() ? eighth.thread_rank() : 1);
    votes = tile.all(votes);
    cg::thread_group quarter = cg::tiled_partition(block, 8);
    quarter.sync();
    if (tile.thread_rank() == 0) warp_sums[tile.meta_group_rank()] = votes && quarter.size() == 8 ? sum : -1.0f;
    cg::sync(block);
    if (tile.meta_group_rank() == 0) {
        float v = tile.thread_rank() < tile.meta_group_size() ? warp_sums[tile.thread_rank()] : 0.0f;
        for (int offset = tile.size() / 2; offset > 0; offset /= 2) {
            v += tile.shfl_down(v, offset);
        }
        // The largest rank of the tile is 31 and the or of all ranks 31: anything else spoils the sum.
        float largest = cg::reduce(tile, (float)tile.thread_rank(), cg::greater<float>());
        unsigned int any_bits = cg::reduce(tile, tile.thread_rank(), cg::bit_or<unsigned int>());
        if (tile.thread_rank() == 0) g_out[block.group_index().x] = largest == 31.0f && any_bits == 31 ? v : -1.0f;
    }
}
