// Stub for the CPU backend: everything CUDA C needs is in the force-included ag_prelude.h.
#pragma once
