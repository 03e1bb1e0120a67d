// CUDA's cooperative_groups/reduce.h for the CPU backend: cg::reduce is in ../ag_cg_reduce.h.
#pragma once
#include "../ag_cg_reduce.h"
