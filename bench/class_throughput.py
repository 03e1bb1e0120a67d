"""Grade a synthetic class and print hand-ins per minute, time per phase and the GPU's busy share.

    .venv/bin/python bench/class_throughput.py [--students 500] [--workers 16] [--gpus all] [--serial 8]
                                               [--backend auto] [--quick] [--no-speed] [--distinct] [--out DIR]

The class mixes the example hand-ins with mutants of the reference kernels (a missing barrier, an
off-by-one bound, a lost element, an unrolled warp without __syncwarp, ...), each student drawing its stages
at random from a fixed seed, so runs are comparable. First `--serial` students are graded one after another
(the serial rate), then the whole class with the workers and GPUs asked for, in the same run.

Identical kernels are graded once per class (autograder.memo), and most of this class's kernels are shared, as
in a course where many hand in the lecture's code. `--distinct` gives every student's every kernel a comment of
its own, so that nothing is shared: the memo's worst case.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from autograder.batch import ClassOptions, grade_class
from autograder.grade import GradeOptions
from autograder.notebook import kernel_cell, stage_cells
from autograder.references import reference_source
from autograder.report import phase_summary
from autograder.stages import REQUIRED_STAGE_IDS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "submissions"

# (text in a reference kernel, what replaces it): each makes a typical student bug where it applies.
MUTATIONS = (
    ("__syncthreads();", ""),  # a missing barrier: a race
    ("(i < n)", "(i <= n)"),  # reads one past the end
    ("if (tid < s)", "if (tid <= s)"),  # adds one element twice
    ("__syncwarp();", ""),  # the unrolled warp without __syncwarp: a race since sm_70
    ("g_out[blockIdx.x] = ", "g_out[0] = "),  # every block writes one place
)


def synthesise(folder: Path, count: int, seed: int = 0, distinct: bool = False) -> None:
    """`count` notebooks in `folder`: each stage a reference (60 %), a mutant (25 %) or an example's (15 %);
    with `distinct`, each kernel marked as the student's own by a comment."""
    rng = random.Random(seed)
    examples = [stage_cells(path) for path in sorted(EXAMPLES.glob("*.ipynb"))]
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        cells = []
        for stage_id in REQUIRED_STAGE_IDS:
            text = reference_source(stage_id).text
            draw = rng.random()
            if draw < 0.25:
                old, new = rng.choice([m for m in MUTATIONS if m[0] in text] or [("", "")])
                text = text.replace(old, new, 1) if old else text
            elif draw < 0.40:
                cell = rng.choice(examples).get(stage_id)
                text = cell.source.text if cell is not None and cell.source is not None else text
            if distinct:
                text = f"// {stage_id} by student {index}\n{text}"
            cells.append(kernel_cell(stage_id, text))
        nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"student{index:04d}.ipynb")


class GpuBusy:
    """The GPU's utilisation sampled by nvidia-smi every 200 ms while grading, where there is one. Also
    what the machine's processes wait for in the kernel while they cannot be interrupted (state D), by where
    they wait and what they run: where a class is slow while the CPUs are idle, that names the lock."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.blocked: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> GpuBusy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        smi, ps = shutil.which("nvidia-smi"), shutil.which("ps")
        while not self._stop.wait(0.2):
            self.ticks += 1
            if smi:
                query = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
                out = subprocess.run(query, capture_output=True, text=True).stdout.split()
                if out:
                    self.samples.append(sum(float(x) for x in out) / len(out))
            if not ps:
                continue
            states = subprocess.run([ps, "-eo", "stat=,wchan:40=,comm="], capture_output=True, text=True).stdout
            for line in states.splitlines():
                stat, wchan, command = (line.split(None, 2) + ["", ""])[:3]
                if stat.startswith("D"):
                    self.blocked[wchan, command] += 1

    def waits(self) -> str:
        """The places processes waited in state D most often, with the share of samples that saw each."""
        ticks = max(self.ticks, 1)
        top = self.blocked.most_common(5)
        return "; ".join(f"{command} in {wchan}: {count / ticks:.1f} a sample" for (wchan, command), count in top)

    def share(self) -> str:
        return f"{sum(self.samples) / len(self.samples):.0f} %" if self.samples else "n/a (no nvidia-smi)"


def timed(folder: Path, out: Path, options: GradeOptions, spread: ClassOptions) -> tuple[float, object, str]:
    started = time.monotonic()

    def progress(_: str, done: int, total: int) -> None:
        # A line now and then, so that a run cut short still shows its rate.
        if done % max(1, min(50, total // 10)) == 0 or done == total:
            elapsed = time.monotonic() - started
            print(f"  {done}/{total} graded in {elapsed:.0f} s ({done / elapsed * 60:.1f} a minute)", flush=True)

    with GpuBusy() as busy:
        run = grade_class(folder, out, options, spread=spread, on_student=progress)
    if busy.blocked:
        print(f"  waiting in the kernel (state D): {busy.waits()}")
    return time.monotonic() - started, run, busy.share()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=500)
    parser.add_argument("--serial", type=int, default=8, help="students graded one by one first, for the rate")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--gpus", default="", help="all, or GPU numbers such as 0,1")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--distinct", action="store_true", help="no two students share a kernel")
    parser.add_argument("--out", type=Path, help="keep the class and results here")
    args = parser.parse_args()
    from autograder.cli import _gpu_list

    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="class-throughput-"))
    synthesise(base / "class", args.students, distinct=args.distinct)
    subset = base / "subset"
    subset.mkdir(exist_ok=True)
    for path in sorted((base / "class").glob("*.ipynb"))[: args.serial]:
        shutil.copy(path, subset)
    options = GradeOptions(backend=args.backend, seed=1, quick=args.quick, measure_speed=not args.no_speed)
    gpus = _gpu_list(args.gpus) if args.gpus else ()
    serial_s, serial, serial_busy = timed(subset, base / "serial", options, ClassOptions(gpus=gpus[:1]))
    whole_s, whole, whole_busy = timed(base / "class", base / "results", options,
                                       ClassOptions(workers=args.workers, gpus=gpus))
    sharing = "no kernel shared" if args.distinct else "kernels shared as in a course"
    print(f"class of {args.students} synthetic hand-ins ({sharing}), backend {args.backend}, gpus {gpus or 'default'}")
    print(f"{'run':<28} {'students':>8} {'seconds':>8} {'per minute':>10} {'GPU busy':>9}")
    print(f"{'serial (one by one)':<28} {len(serial.results):8d} {serial_s:8.1f} "
          f"{len(serial.results) / serial_s * 60:10.1f} {serial_busy:>9}")
    print(f"{f'{args.workers} workers':<28} {len(whole.results):8d} {whole_s:8.1f} "
          f"{len(whole.results) / whole_s * 60:10.1f} {whole_busy:>9}")
    print("serial:   " + phase_summary(serial.results, serial_s))
    print("parallel: " + phase_summary(whole.results, whole_s))
    for name, run in (("serial", serial), ("parallel", whole)):
        if run.failures:
            student, error = run.failures[0]
            print(f"{name}: {len(run.failures)} grader failure(s); the first, {student}:\n{error}")


if __name__ == "__main__":
    main()
