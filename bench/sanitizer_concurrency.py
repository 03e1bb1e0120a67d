"""How compute-sanitizer sessions on one GPU slow each other down: k sessions started at once, for several k.

    python3 bench/sanitizer_concurrency.py [--tool racecheck] [--counts 1,2,4,8,16] [--load 16]

Each session is `compute-sanitizer --tool T python3 -c ...` that creates a CUDA context, loads a small kernel
(a shared-memory tree sum) and runs it once: what a sanitized worker of the grader does, without the grader.
Prints, for each k, the wall time of the k sessions together and the time per session. `--load N` keeps N
plain CUDA processes copying 256 MiB to and from the GPU meanwhile, as the workers of a class do.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from autograder.sanitizer import find_sanitizer

SESSION = r"""
import numpy as np, pycuda.driver as cuda
from pycuda.compiler import SourceModule
cuda.init(); context = cuda.Device(0).make_context()
try:
    module = SourceModule('''
    __global__ void tree(const float *in, float *out) {
        __shared__ float s[256];
        s[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
        __syncthreads();
        for (int k = 128; k > 0; k >>= 1) {
            if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
            __syncthreads();
        }
        if (threadIdx.x == 0) out[blockIdx.x] = s[0];
    }''')
    data = np.ones(1024, np.float32); out = np.zeros(4, np.float32)
    module.get_function("tree")(cuda.In(data), cuda.Out(out), block=(256, 1, 1), grid=(4, 1))
    assert out.sum() == 1024
finally:
    context.pop()
"""


LOAD = r"""
import numpy as np, pycuda.driver as cuda
cuda.init(); context = cuda.Device(0).make_context()
host = np.ones(1 << 26, np.float32); device = cuda.mem_alloc(host.nbytes)
while True:
    cuda.memcpy_htod(device, host); cuda.memcpy_dtoh(host, device)
"""


def sessions(tool: str, count: int) -> float:
    """Seconds for `count` sanitized sessions started together to end."""
    sanitizer = find_sanitizer()
    assert sanitizer, "compute-sanitizer is not installed here"
    started = time.perf_counter()
    running = [
        subprocess.Popen([sanitizer, "--tool", tool, sys.executable, "-c", SESSION], stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    failed = sum(process.wait() != 0 for process in running)
    assert not failed, f"{failed} of {count} sanitized sessions failed: the figures would not be comparable"
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default="racecheck")
    parser.add_argument("--counts", default="1,2,4,8,16")
    parser.add_argument("--load", type=int, default=0, help="plain CUDA processes copying meanwhile")
    args = parser.parse_args()
    sessions(args.tool, 1)  # warm: the kernel compiled once into PyCUDA's cache
    load = [subprocess.Popen([sys.executable, "-c", LOAD]) for _ in range(args.load)]
    try:
        time.sleep(3 if load else 0)
        print(f"{'sessions at once':>16} {'wall s':>8} {'s per session':>14}  ({args.tool}, {args.load} copying)")
        for count in (int(k) for k in args.counts.split(",")):
            wall = sessions(args.tool, count)
            print(f"{count:16d} {wall:8.2f} {wall / count:14.2f}", flush=True)
    finally:
        for process in load:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
