"""Grade two synthetic classes on one GPU and on all GPUs, side by side, and print hand-ins per minute.

    .venv/bin/python bench/class_throughput.py [--students 500] [--distinct-students 32] [--workers 16]
                                               [--gpus all] [--serial 3] [--classes shared,distinct]
                                               [--backend auto] [--quick] [--no-speed] [--out DIR]

Two classes, each run compiling its students' kernels afresh, as at a deadline (a comment of the run's own on
every kernel), with the grader's own builds cached, as on any grading machine after its first class:
- "shared", a course's mix: each student draws each stage from the reference kernels (60 %), mutants of them
  (a missing barrier, an off-by-one bound, a lost element, an unrolled warp without __syncwarp, ...; 25 %) or
  the example hand-ins (15 %), from a fixed seed, so runs are comparable. Identical kernels are graded once per
  class (autograder.memo), so most of this class's work is shared.
- "distinct", a class where every student wrote every kernel: each kernel gets a comment of its own, so the
  memo shares nothing. This is the real case of a course, and the headline.

Each class is first graded `--serial` students one by one, then whole on the first GPU, then on all GPUs (when
there are several), with `--workers` students at once. Printed: the rate of each tenth of the class as it goes,
then a table of the classes side by side, where the time went, the GPU's busy share, where processes waited in
the kernel (state D), the processes that ended by program (process accounting, as root), and whether the grades
agree between the runs.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import random
import secrets
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.batch import ClassOptions, ClassRun, grade_class
from autograder.grade import GradeOptions
from autograder.notebook import kernel_cell, stage_cells
from autograder.references import reference_source
from autograder.report import phase_summary
from autograder.stages import REQUIRED_STAGE_IDS
from autograder.timing import input_folder

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


def synthesise(folder: Path, count: int, seed: int = 0, distinct: bool = False, salt: str = "") -> None:
    """`count` notebooks in `folder`: each stage a reference (60 %), a mutant (25 %) or an example's (15 %);
    with `distinct`, each kernel marked as the student's own by a comment. `salt`, a last comment on every
    kernel, makes every kernel of the class one no earlier run compiled: each run compiles its class afresh,
    as at a deadline, while the grader's own builds (the CPU runtime, the reference kernels) stay cached, as on
    any grading machine after its first class."""
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
            cells.append(kernel_cell(stage_id, f"{text}// {salt}\n" if salt else text))
        nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"student{index:04d}.ipynb")


class GpuBusy:
    """The GPU's utilisation sampled by nvidia-smi every 200 ms while grading, where there is one, and the
    processes seen holding a CUDA context (each one a context the driver made and destroyed). Also what the
    machine's processes wait for in the kernel while they cannot be interrupted (state D), by where they wait and
    what they run: where a class is slow while the CPUs are idle, that names the lock."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.unreadable = 0  # samples nvidia-smi answered without a utilisation ("[N/A]": a GPU in trouble)
        self.blocked: collections.Counter[tuple[str, str]] = collections.Counter()
        self.contexts: set[str] = set()  # processes seen holding a CUDA context
        self.programs = ProgramTimes()
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> GpuBusy:
        self._cpu = [_cpu_times()]
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._cpu.append(_cpu_times())

    def cpu_share(self) -> str:
        (busy0, total0), (busy1, total1) = self._cpu
        return f"{(busy1 - busy0) / max(total1 - total0, 1) * 100:.0f} %" if total1 else "n/a"

    def _sample(self) -> None:
        smi, ps = shutil.which("nvidia-smi"), shutil.which("ps")
        while not self._stop.wait(0.2):
            self.ticks += 1
            self.programs.sample()
            if smi:
                query = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
                out = subprocess.run(query, capture_output=True, text=True).stdout.split()
                busy = [float(x) for x in out if x.replace(".", "", 1).isdigit()]  # not "[N/A]" (a GPU in trouble)
                if busy:
                    self.samples.append(sum(busy) / len(busy))
                elif out:
                    self.unreadable += 1
                apps = [smi, "--query-compute-apps=pid", "--format=csv,noheader"]
                self.contexts |= set(subprocess.run(apps, capture_output=True, text=True).stdout.split())
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
        trouble = f" ({self.unreadable} samples without a utilisation: is the GPU well?)" if self.unreadable else ""
        return (f"{sum(self.samples) / len(self.samples):.0f} %" if self.samples else "n/a (no nvidia-smi)") + trouble


FINAL_ROLES = ("GPU", "sanitizer", "CPU backend")  # a worker's role that does not change any more


class ProgramTimes:
    """The CPU seconds of the machine's processes by program, read from /proc at each sample: which programs a
    class's core-seconds went to. Python processes are told apart by role: a grading process, a worker under
    compute-sanitizer, a worker on the GPU (it holds a /dev/nvidia file), a worker on the CPU backend (it maps
    its runtime), and a worker still starting (its imports), which may become either. A process that starts
    and ends between two samples is missed, so the total is below the CPUs' own count."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._seen: dict[int, int] = {pid: ticks for pid, (_, ticks) in self._now().items()}  # before the run
        self._roles: dict[int, str] = {}
        self._tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _now() -> dict[int, tuple[str, int]]:
        found = {}
        for entry in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = entry.read_text()
            except OSError:
                continue
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            found[int(entry.parent.name)] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
        return found

    def _role(self, pid: int, name: str) -> str:
        if not name.startswith("python") or self._roles.get(pid, "").endswith(FINAL_ROLES):
            return self._roles.get(pid, name)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            above = Path(f"/proc/{parent}/comm").read_text().strip()
            files = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()] if b"isolation" in command else []
            maps = Path(f"/proc/{pid}/maps").read_text() if b"isolation" in command else ""
        except OSError:
            return self._roles.get(pid, name)
        if b"autograder.isolation" not in command:
            role = "python: grading process" if b"multiprocessing" in command else "python: the bench"
        elif above.startswith(("compute-saniti", "TreeLauncher")):
            role = "python: worker under compute-sanitizer"
        elif any(path.startswith("/dev/nvidia") for path in files):
            role = "python: worker on the GPU"
        elif "libagrt-" in maps:
            role = "python: worker on the CPU backend"
        else:
            role = "python: worker starting"
        self._roles[pid] = role
        return role

    def sample(self) -> None:
        for pid, (name, ticks) in self._now().items():
            delta = ticks - self._seen.get(pid, 0)
            if delta:
                self.seconds[self._role(pid, name)] += delta / self._tick
            self._seen[pid] = ticks

    def top(self, count: int = 12) -> str:
        total = sum(self.seconds.values())
        shown = "; ".join(f"{name} {seconds:.0f}" for name, seconds in self.seconds.most_common(count))
        return f"{total:.0f} core-seconds seen: {shown}"

    def started(self) -> str:
        """How many worker processes of each role were seen (each a process start; on the GPU, a context)."""
        roles = collections.Counter(role for role in self._roles.values() if role.startswith("python: worker"))
        return "; ".join(f"{role.removeprefix('python: ')} {count}" for role, count in roles.most_common())


class Accounting:
    """Every process that ended while grading, by program: the kernel's process accounting (acct(2), version 3
    records), where this bench may turn it on (as root). It counts what the /proc sampler misses, the compilers
    and tools that live for less than a sample, and says how many processes a student costs."""

    RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")  # struct acct_v3

    def __enter__(self) -> Accounting:
        handle, name = tempfile.mkstemp(prefix="autograder-pacct-")
        os.close(handle)
        self.path = Path(name)
        self.on = ctypes.CDLL(None, use_errno=True).acct(os.fsencode(self.path)) == 0
        return self

    def __exit__(self, *_: object) -> None:
        if self.on:
            ctypes.CDLL(None).acct(None)
        else:
            self.path.unlink(missing_ok=True)

    def programs(self) -> tuple[collections.Counter[str], collections.Counter[str]]:
        """Core-seconds and processes by program name."""
        seconds: collections.Counter[str] = collections.Counter()
        count: collections.Counter[str] = collections.Counter()
        data = self.path.read_bytes()
        self.path.unlink(missing_ok=True)
        for offset in range(0, len(data) - self.RECORD.size + 1, self.RECORD.size):
            fields = self.RECORD.unpack_from(data, offset)
            if fields[1] != 3:
                continue
            name = fields[-1].split(b"\0")[0].decode(errors="replace")
            seconds[name] += (_comp(fields[10]) + _comp(fields[11])) / 100  # utime and stime, in 1/100 s
            count[name] += 1
        return seconds, count

    def summary(self, students: int, top: int = 10) -> str:
        if not self.on:
            return "not measured (process accounting needs root)"
        seconds, count = self.programs()
        shown = "; ".join(f"{name} {secs:.0f} ({count[name]})" for name, secs in seconds.most_common(top))
        total, cores = sum(count.values()), sum(seconds.values())
        return f"{total} processes ({total / students:.0f} a student), {cores:.0f} core-seconds: {shown}"


def _comp(value: int) -> int:
    """A comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


@dataclass
class Measured:
    """One class graded once: its wall time, results, GPU busy share and where processes waited."""

    seconds: float
    run: ClassRun
    busy: str
    waits: str
    tenths: list[str]
    contexts: int  # processes seen holding a CUDA context
    cpu: str  # the CPUs' busy share
    programs: str  # the core-seconds seen by program
    workers: str  # the worker processes seen, by role

    @property
    def rate(self) -> float:
        return len(self.run.results) / self.seconds * 60


def _cpu_times() -> tuple[int, int]:
    """The CPUs' busy and total ticks so far (/proc/stat), or zeros where there is none."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def timed(folder: Path, out: Path, options: GradeOptions, spread: ClassOptions, label: str) -> Measured:
    """Grade `folder`, printing the rate of each tenth of the class as it goes, so a slow start or a slow tail
    shows, then where the time went. The timing inputs an earlier run drew are removed first: a class at a
    deadline has a seed of its own, so its grader draws them afresh (this bench's runs share one seed, so that
    their grades compare)."""
    shutil.rmtree(input_folder(), ignore_errors=True)
    started = time.monotonic()
    last = [0, started]  # students graded, and when, at the end of the last tenth
    tenths: list[str] = []

    def progress(_: str, done: int, total: int) -> None:
        if done < total and done - last[0] < max(1, total // 10):
            return
        now = time.monotonic()
        rate = (done - last[0]) / max(now - last[1], 1e-9) * 60
        last[:] = [done, now]
        tenths.append(f"{rate:.0f}")
        print(f"  {label}: {done}/{total} in {now - started:.0f} s ({rate:.0f} a minute in this tenth)", flush=True)

    with GpuBusy() as busy, Accounting() as accounting:
        run = grade_class(folder, out, options, spread=spread, on_student=progress)
    measured = Measured(time.monotonic() - started, run, busy.share(), busy.waits(), tenths, len(busy.contexts),
                        busy.cpu_share(), busy.programs.top(), busy.programs.started())
    students = max(len(run.results), 1)
    print(f"  {label}: GPU busy {measured.busy}, CPUs busy {measured.cpu}; CUDA contexts {measured.contexts} "
          f"({measured.contexts / students:.2f} a student); a minute per tenth: {' '.join(tenths)}")
    print(f"  {label}: {phase_summary(run.results, measured.seconds)}")
    print(f"  {label}: CPU by program: {measured.programs}")
    print(f"  {label}: worker processes seen: {measured.workers}")
    print(f"  {label}: processes ended, by program (core-seconds, count): {accounting.summary(students)}")
    if measured.waits:
        print(f"  {label}: waiting in the kernel (state D): {measured.waits}")
    if run.lost_workers:
        print(f"  {label}: {run.lost_workers} worker process(es) lost and replaced")
    if run.failures:
        student, error = run.failures[0]
        print(f"  {label}: {len(run.failures)} grader failure(s); the first, {student}:\n{error}")
    return measured


def grades(run: ClassRun) -> dict[str, list]:
    """What must not depend on how a class was graded: each student's statuses, correctness points and findings,
    stage by stage."""
    return {
        result.student: [
            (s.stage, s.status.value, s.points.correctness if s.points else None, sorted(f.kind for f in s.findings))
            for s in result.stages
        ]
        for result in run.results
    }


INVOCATION = secrets.token_hex(4)  # in every salt: a second bench on the same cache compiles afresh too


def classroom(base: Path, name: str, run: str, count: int) -> Path:
    """The class `name` for one run, its kernels salted with the run's name and this invocation's token, so
    that no cached build of an earlier run or an earlier bench serves them."""
    folder = base / name / run.replace(" ", "-")
    synthesise(folder / "class", count, distinct=name == "distinct", salt=f"{run} {INVOCATION}")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=500, help="hand-ins of the course-mix class")
    parser.add_argument("--distinct-students", type=int, default=32, help="hand-ins of the class of own kernels")
    parser.add_argument("--serial", type=int, default=3, help="students of each class graded one by one first")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--gpus", default="all", help="all, or GPU numbers such as 0,1; the first is the 'one GPU'")
    parser.add_argument("--classes", default="shared,distinct", help="which classes, comma-separated (default both)")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--out", type=Path, help="keep the classes and results here")
    parser.add_argument("--fresh-workers", action="store_true", help="no GPU worker kept between students")
    args = parser.parse_args()
    from autograder.cli import _gpu_list

    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="class-throughput-"))
    options = GradeOptions(backend=args.backend, seed=1, quick=args.quick, measure_speed=not args.no_speed)
    gpus = _gpu_list(args.gpus) if args.gpus and args.backend != "cpu" else ()
    placements = {"one GPU" if gpus else "here": gpus[:1]} | ({f"{len(gpus)} GPUs": gpus} if len(gpus) > 1 else {})
    sizes = {"shared": args.students, "distinct": args.distinct_students}
    if unknown := set(args.classes.split(",")) - sizes.keys():
        parser.error(f"no class named {', '.join(sorted(unknown))}: the classes are shared and distinct")
    rows = []
    share = not args.fresh_workers
    for name in args.classes.split(","):
        # The first students alone: also builds the grader's own (the CPU runtime, the references) once.
        serial_folder = classroom(base, name, "serial", args.serial)
        serial = timed(serial_folder / "class", serial_folder / "results", options,
                       ClassOptions(gpus=gpus[:1], share_workers=share), f"{name} serial")
        measured = {}
        for where, placed in placements.items():
            folder = classroom(base, name, where, sizes[name])
            measured[where] = timed(folder / "class", folder / "results", options,
                                    ClassOptions(workers=args.workers, gpus=placed, share_workers=share),
                                    f"{name} on {where}")
        rows.append((name, serial, measured))
    print()
    workers = "fresh workers for every student" if args.fresh_workers else "GPU workers kept between students"
    print(f"backend {args.backend}, {args.workers} workers, GPUs {gpus or 'none'}, {workers}; every run compiles "
          "its students' kernels afresh")
    header = f"{'class':<10} {'students':>8} {'serial /min':>11}"
    for where in placements:
        header += f" {where + ' s':>11} {where + ' /min':>13}"
    print(header + (f" {'speed-up':>9}" if len(placements) > 1 else ""))
    for name, serial, measured in rows:
        line = f"{name:<10} {sizes[name]:>8} {serial.rate:>11.1f}"
        for result in measured.values():
            line += f" {result.seconds:>11.1f} {result.rate:>13.1f}"
        rates = [result.rate for result in measured.values()]
        print(line + (f" {rates[-1] / rates[0]:>8.2f}x" if len(rates) > 1 else ""))
    for name, serial, measured in rows:
        first, *others = measured.values()
        for where, result in zip(list(measured)[1:], others, strict=True):
            compare(f"{name}: grades on {where}", result.run, first.run, "those on one GPU")
        compare(f"{name}: the serial students' grades", serial.run, first.run, "theirs in the class run")


def compare(what: str, these: ClassRun, those: ClassRun, whose: str) -> None:
    """Whether every student of `these` has the same grades in `those`; where not, each stage that differs, as
    (stage, status, correctness points, findings) here and there, and its message in each run, which says why
    (a timeout's says which limit ran out where)."""
    mine, theirs = grades(these), grades(those)
    differing = {
        student: [(here, there) for here, there in zip(grade, theirs.get(student, []), strict=False) if here != there]
        for student, grade in mine.items()
        if theirs.get(student) != grade
    }
    print(f"{what} {'DIFFER from' if differing else 'equal'} {whose}")
    said = [messages(these), messages(those)]
    for student, stages in sorted(differing.items())[:5]:
        print(f"  {student}: " + "; ".join(f"{here} here, {there} there" for here, there in stages))
        for here, _ in stages:
            for where, by_student in zip(("here", "there"), said, strict=True):
                print(f"    {here[0]} {where}: {by_student.get(student, {}).get(here[0], '(no result)')[:300]}")


def messages(run: ClassRun) -> dict[str, dict[str, str]]:
    """Each student's message for each stage."""
    return {result.student: {s.stage: s.message for s in result.stages} for result in run.results}


if __name__ == "__main__":
    main()
