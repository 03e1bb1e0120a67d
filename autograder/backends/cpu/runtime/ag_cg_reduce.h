// cg::reduce for the CPU backend, with its function objects: what CUDA's cooperative_groups/reduce.h declares.
// It lives here, not in the cooperative_groups folder, so that the CPU backend's build cache key covers it.
#pragma once

#include "cooperative_groups.h"

namespace cooperative_groups {

template <class T>
struct plus {
    T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct less {
    T operator()(T a, T b) const { return b < a ? b : a; }
};
template <class T>
struct greater {
    T operator()(T a, T b) const { return a < b ? b : a; }
};
template <class T>
struct bit_and {
    T operator()(T a, T b) const { return a & b; }
};
template <class T>
struct bit_or {
    T operator()(T a, T b) const { return a | b; }
};
template <class T>
struct bit_xor {
    T operator()(T a, T b) const { return a ^ b; }
};

// The reduction of `value` over a tile, returned to every thread of it: a butterfly of shuffles.
template <unsigned int Size, class ParentT, class T, class Op>
static inline T reduce(const thread_block_tile<Size, ParentT> &tile, T value, Op op, int line = __builtin_LINE()) {
    for (unsigned int offset = Size / 2; offset > 0; offset /= 2) value = op(value, tile.shfl_xor(value, offset, line));
    return value;
}

}  // namespace cooperative_groups
