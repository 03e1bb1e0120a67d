"""What the sandbox costs: seconds to grade one student with it and without it, side by side in one run.

    .venv/bin/python bench/sandbox_overhead.py [--student alice] [--rounds 3] [--backend cpu] [--quick]

The two settings alternate round by round (sandboxed first in odd rounds, unsandboxed first in even ones), on
the same notebook and seed, with the build caches warm after a first untimed round of each, so the figures
compare the same work. Printed: each setting's median and range, and the overhead of the sandbox.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from autograder.grade import GradeOptions, grade_notebook

ROOT = Path(__file__).resolve().parent.parent


def seconds(notebook: Path, options: GradeOptions) -> float:
    started = time.perf_counter()
    grade_notebook(notebook, notebook.stem, options)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", default="alice", help="an example hand-in in examples/submissions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--quick", action="store_true", help="skip the largest correctness cases")
    args = parser.parse_args()
    notebook = ROOT / "examples" / "submissions" / f"{args.student}.ipynb"
    base = GradeOptions(backend=args.backend, seed=1, quick=args.quick, measure_speed=False)
    settings = {"sandboxed": replace(base, sandbox=True), "unsandboxed": replace(base, sandbox=False)}
    for options in settings.values():
        seconds(notebook, options)  # warm the build caches
    times: dict[str, list[float]] = {name: [] for name in settings}
    for round_number in range(args.rounds):
        order = list(settings) if round_number % 2 == 0 else list(reversed(settings))
        for name in order:
            times[name].append(seconds(notebook, settings[name]))
    print(f"grading {args.student} ({args.backend} backend, {args.rounds} rounds, speed not measured)")
    print(f"{'setting':<12} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in times.items():
        print(f"{name:<12} {statistics.median(values):9.2f} {min(values):7.2f} {max(values):7.2f}")
    sandboxed, plain = (statistics.median(times[name]) for name in ("sandboxed", "unsandboxed"))
    print(f"overhead of the sandbox: {sandboxed - plain:+.2f} s per student ({(sandboxed / plain - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
