// Cooperative groups for the CPU backend: the block and tiles of up to a warp (cg::reduce is in
// ag_cg_reduce.h, which cooperative_groups/reduce.h includes, as CUDA has it), mapped onto the runtime's barrier
// and warp collectives, so races, deadlocks and lanes that do not take
// part are checked as for __syncthreads() and the __*_sync intrinsics. Every call takes the caller's line
// (a defaulted __builtin_LINE()), so a report names the student's line, not this header's.
#pragma once

namespace cooperative_groups {

namespace __ag {
static inline unsigned int block_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline unsigned int block_threads() { return blockDim.x * blockDim.y * blockDim.z; }
static inline unsigned int lane() { return block_rank() % 32; }
// The lanes of the tile of `size` lanes (a power of two up to 32) holding this thread.
static inline unsigned int tile_mask(unsigned int size) {
    const unsigned int bits = size >= 32 ? 0xffffffffu : (1u << size) - 1;
    return bits << (lane() & ~(size - 1));
}
}  // namespace __ag

class thread_block {
  public:
    void sync(int line = __builtin_LINE()) const { __ag_syncthreads(line); }
    static unsigned int thread_rank() { return __ag::block_rank(); }
    static unsigned int size() { return __ag::block_threads(); }
    static unsigned int num_threads() { return __ag::block_threads(); }
    static dim3 group_index() { return dim3(blockIdx); }
    static dim3 thread_index() { return dim3(threadIdx); }
    static dim3 group_dim() { return blockDim; }
    static dim3 dim_threads() { return blockDim; }
    static bool is_valid() { return true; }
};

static inline thread_block this_thread_block() { return thread_block(); }

// Blocks run one after another on the CPU backend, so a grid-wide barrier cannot exist: grid_group has none.
class grid_group {
  public:
    static unsigned long long thread_rank() {
        return static_cast<unsigned long long>(block_rank()) * __ag::block_threads() + __ag::block_rank();
    }
    static unsigned long long size() { return num_threads(); }
    static unsigned long long num_threads() {
        return static_cast<unsigned long long>(num_blocks()) * __ag::block_threads();
    }
    static unsigned long long block_rank() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
    static unsigned long long num_blocks() { return static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z; }
    static dim3 block_index() { return dim3(blockIdx); }
    static dim3 group_dim() { return gridDim; }
    static bool is_valid() { return true; }
};

static inline grid_group this_grid() { return grid_group(); }

// A tile of Size lanes (a power of two up to 32) of one warp, as tiled_partition<Size> makes it.
template <unsigned int Size, class ParentT = void>
class thread_block_tile {
    static_assert(Size >= 1 && Size <= 32 && (Size & (Size - 1)) == 0,
                  "the CPU backend has tiles of 1, 2, 4, 8, 16 or 32 threads");

  public:
    thread_block_tile() = default;
    template <class OtherParent>
    thread_block_tile(const thread_block_tile<Size, OtherParent> &) {}
    static unsigned int thread_rank() { return __ag::lane() % Size; }
    static constexpr unsigned int size() { return Size; }
    static constexpr unsigned int num_threads() { return Size; }
    static unsigned int meta_group_rank() { return __ag::block_rank() / Size; }
    static unsigned int meta_group_size() { return (__ag::block_threads() + Size - 1) / Size; }
    void sync(int line = __builtin_LINE()) const { __ag_warp(line, AG_SYNCWARP, mask(), 0, 0, 32); }
    template <class T>
    T shfl(T value, int source, int line = __builtin_LINE()) const {
        return __ag_shuffle(line, AG_SHFL, mask(), value, source, Size);
    }
    template <class T>
    T shfl_down(T value, unsigned int delta, int line = __builtin_LINE()) const {
        return __ag_shuffle(line, AG_SHFL_DOWN, mask(), value, static_cast<int>(delta), Size);
    }
    template <class T>
    T shfl_up(T value, unsigned int delta, int line = __builtin_LINE()) const {
        return __ag_shuffle(line, AG_SHFL_UP, mask(), value, static_cast<int>(delta), Size);
    }
    template <class T>
    T shfl_xor(T value, unsigned int lane_mask, int line = __builtin_LINE()) const {
        return __ag_shuffle(line, AG_SHFL_XOR, mask(), value, static_cast<int>(lane_mask), Size);
    }
    // Bit k of the result is the tile's thread k, as CUDA has it.
    unsigned int ballot(int predicate, int line = __builtin_LINE()) const {
        const unsigned int lanes = static_cast<unsigned int>(__ag_warp(line, AG_BALLOT, mask(), predicate != 0, 0, 32));
        return (lanes & mask()) >> (__ag::lane() & ~(Size - 1));
    }
    bool any(int predicate, int line = __builtin_LINE()) const {
        return __ag_warp(line, AG_ANY, mask(), predicate != 0, 0, 32) != 0;
    }
    bool all(int predicate, int line = __builtin_LINE()) const {
        return __ag_warp(line, AG_ALL, mask(), predicate != 0, 0, 32) != 0;
    }

  private:
    static unsigned int mask() { return __ag::tile_mask(Size); }
};

template <unsigned int Size, class ParentT>
static inline thread_block_tile<Size, ParentT> tiled_partition(const ParentT &) {
    return thread_block_tile<Size, ParentT>();
}

// A group whose kind is known only at run time: the block, or a tile of tiled_partition(parent, size).
class thread_group {
  public:
    thread_group(const thread_block &) : tile_(0) {}
    template <unsigned int Size, class P>
    thread_group(const thread_block_tile<Size, P> &) : tile_(Size) {}
    explicit thread_group(unsigned int tile) : tile_(tile) {}
    void sync(int line = __builtin_LINE()) const {
        if (tile_) __ag_warp(line, AG_SYNCWARP, __ag::tile_mask(tile_), 0, 0, 32);
        else __ag_syncthreads(line);
    }
    unsigned int thread_rank() const { return tile_ ? __ag::lane() % tile_ : __ag::block_rank(); }
    unsigned int size() const { return tile_ ? tile_ : __ag::block_threads(); }
    unsigned int num_threads() const { return size(); }

  private:
    unsigned int tile_;  // 0: the whole block
};

template <class ParentT>
static inline thread_group tiled_partition(const ParentT &, unsigned int size) {
    return thread_group(size);
}

template <class Group>
static inline void sync(const Group &group, int line = __builtin_LINE()) {
    group.sync(line);
}
template <class Group>
static inline unsigned long long thread_rank(const Group &group) {
    return group.thread_rank();
}
template <class Group>
static inline unsigned long long group_size(const Group &group) {
    return group.size();
}

}  // namespace cooperative_groups
