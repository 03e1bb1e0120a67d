"""The worker processes a student's kernels run in, and which of them may serve the next student.

A student's kernels run in sandboxed worker processes (autograder.isolation): its main worker (correctness
runs and timing, on the GPU or on the CPU backend), on the GPU a CPU-backend worker for the race analysis, and
compute-sanitizer's sessions, one process per tool. Grading one student alone, every one of them is fresh and
ends with the student.

In a class (`share=True`), the GPU workers of a grading process serve one student after another: the main GPU
worker and the compute-sanitizer sessions (on a local cluster the class's, one a tool and GPU for all its
processes: autograder.sessions). Each fresh one is a CUDA context, which the driver makes and destroys
one at a time: on an H200, one worker started and ended in 0.8 s, and sixteen started together took 5.4 s
(README, "Large classes"). Kept, a class costs a few contexts per grading process instead of four per student.

What a kernel can reach in a kept worker, and why no later student's verdict can depend on it:
- Only the GPU. A kernel is device code, and the worker's host memory is out of its reach unless the GPU can
  access pageable host memory (HMM or ATS, `DeviceInfo.host_memory_access`); where it can, or where that cannot
  be told, nothing is kept.
- Device memory of the same context: every buffer a student's kernels get is allocated for it and filled by the
  grader before use, and every input is uploaded again from host memory for every call. When the student ends,
  every buffer is freed and every module unloaded, the timing helper's too (`verify.forget`).
- A kernel still running when its student ends: every call waits for its kernels, and one that does not end is
  a timeout, which stops the worker. A sticky error (an illegal address, a trap) stops the worker too.
- Writes out of bounds that could land in memory the context keeps: after a student with any out-of-bounds
  write or output-guard finding, or a kernel that crashed or timed out (on any checker), its main worker is not
  kept if that kernel ran in the worker's current process. A crash or a hang in the worker ends its process
  (and its context); the process started after it, for the student's later stages, is kept when every kernel
  it ran was clean: it is then no different from a worker that served a clean student. Nor is a process kept
  where a stage's grading failed after its kernel may have run there (an error, the CPU analysis's compile
  error after the GPU cases, a kernel wrong only when timed), since then no finding tells what it did. A
  kernel seen only reading out of bounds (`i <= n`, common in a class) leaves it kept: a read changes no memory,
  and the CPU analysis tells reads from writes (`Finding.reads_only`); its first stray write of a launch is told
  even past its limit of findings, so stray reads cannot hide one. What no checker saw, such as a write far out
  of bounds only on the graded inputs, is the same risk as for a kernel with no finding: the canary below, and
  fresh buffers filled before use, are what stand against it.
  No kernel caught straying runs in a shared compute-sanitizer session: it is not sanitized at all; one that
  crashed runs in sessions of the student's own (autograder.pipeline.sanitize, autograder.sanitizer); and
  memcheck stops a kernel at its first access outside an allocation, ending its process.
- After every student, a canary: the reference shuffle kernel must give the exact sum of a fixed input in the
  kept GPU worker, else the worker is stopped.
- A kept worker serves at most MAX_STUDENTS students, so its CPU-time limit is never reached in a later
  student's call, and its output file is emptied between students, so its size limit is never reached because
  of what earlier kernels printed.
- A CPU-backend worker is never kept: its kernels run as native code in the worker's own memory.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from autograder.build import reference_build
from autograder.errors import GraderError
from autograder.isolation import Worker, worker_kind
from autograder.records import DeviceInfo
from autograder.references import references_available
from autograder.sandbox import Sandbox
from autograder.schedule import gpu_gate
from autograder.sessions import Address, RemoteSession
from autograder.stages import get_stage
from autograder.verify import Case, case_reference, forget, run_case

MAX_STUDENTS = 100  # students a kept worker serves before it is replaced
RESET_SECONDS = 60.0
CANARY_STAGE = "shuffle"
CANARY_CASE = Case((100_003,), "integers", 20261124)  # integers: the exact sum, in any order of adds

_kept: dict[str, list[tuple[Worker, int]]] = {}  # this process's idle workers by kind, with the students served
_kept_lock = threading.Lock()


def reusable(device: DeviceInfo) -> bool:
    """Whether a worker on `device` may serve a later student: a GPU whose kernels cannot reach host memory."""
    return device.backend == "gpu" and device.host_memory_access is False


class StudentWorkers:
    """The worker processes of one student. `close` ends the student: what may serve the next one is made
    ready for it and kept in this process, the rest is closed."""

    def __init__(
        self,
        backend: str,
        options: Mapping[str, Any],
        sandbox: Sandbox,
        *,
        share: bool = False,
        main: Worker | None = None,
        sessions: Address | None = None,
    ) -> None:
        """`main`: a worker of the caller's, used and left open; else one is taken or started here. `sessions`:
        where the class's shared compute-sanitizer sessions are served (autograder.sessions), if anywhere."""
        self.backend = backend
        self.options = dict(options)
        self.sandbox = sandbox
        self._share = share and references_available()  # the canary is a reference kernel
        self._given = main is not None
        self._served: dict[int, int] = {}  # id(worker): students it served before this one
        self.main = main if main is not None else self._take(backend, ())
        self._checker: Worker | None = None
        self._shared: dict[str, Worker] = {}  # compute-sanitizer sessions shared with other students, by tool
        self._hosted = sessions
        self._remote: dict[str, RemoteSession] = {}  # the same, served by the class's host, by tool
        self._sessions: dict[str, Worker] = {}  # this student's own sessions, by tool
        self._own: list[Worker] = []  # every session of this student's own, closed with it
        self._starting: threading.Thread | None = None  # the CPU analysis's worker starting ahead
        # Set by the pipeline when the student is graded: none of its kernels crashed, timed out or wrote out of
        # bounds (see the module's docstring). Only then are its shared workers kept.
        self.clean = False

    @property
    def sharing(self) -> bool:
        """Whether this student's GPU workers serve later students (see the module's docstring)."""
        return self._share and reusable(self.main.device)

    def checker(self) -> Worker:
        """The CPU backend's worker for the race analysis of GPU stages: always this student's own."""
        if self._checker is None:
            self._checker = Worker("cpu", self.options, self.sandbox)
        return self._checker

    def start_checker_ahead(self) -> None:
        """Start the CPU analysis's worker now, in a thread of its own (`close` waits for it); one that cannot
        start says why at its first use."""

        def start() -> None:
            with suppress(Exception):
                self.checker().start()

        self._starting = threading.Thread(target=start, daemon=True)
        self._starting.start()

    def session(self, tool: str, launcher: tuple[str, ...], how: str) -> Worker | RemoteSession:
        """A worker started under compute-sanitizer's `tool`, shared as `how` says (autograder.sanitizer):
        "shared", a session other students use too: the class's (autograder.sessions) where it has them, else
        one kept in this process (this student's own when its workers are not kept); "student", a session of
        this student's alone; "alone", a new session for one kernel."""
        if how == "alone":
            worker = Worker("gpu", self.options, self.sandbox, launcher=launcher)
            self._own.append(worker)
            return worker
        if how == "shared" and self.sharing:
            if self._hosted is not None:
                if tool not in self._remote:
                    self._remote[tool] = RemoteSession(self._hosted, tool, int(self.options.get("device_index", 0)))
                return self._remote[tool]
            if tool not in self._shared:
                self._shared[tool] = self._take("gpu", launcher)
            return self._shared[tool]
        if tool not in self._sessions:
            self._sessions[tool] = Worker("gpu", self.options, self.sandbox, launcher=launcher)
            self._own.append(self._sessions[tool])
        return self._sessions[tool]

    def close(self) -> None:
        """End the student: its own workers close; its shared ones are kept for the next student, each after its
        reset: the compute-sanitizer sessions always (only memory-safe kernels run in them), the main worker when
        the student was `clean`, and after its canary."""
        if self._starting is not None:
            self._starting.join()  # a worker still starting is closed once it has started, not left running
        for worker in (*self._own, *([self._checker] if self._checker else [])):
            worker.close()
        for remote in self._remote.values():
            remote.close()
        for worker in self._shared.values():  # only memory-safe kernels ran in them (autograder.sanitizer)
            self._release(worker, self.sharing, canary=False)
        if not self._given:
            self._release(self.main, self.clean and self.sharing, canary=True)

    def _take(self, backend: str, launcher: tuple[str, ...]) -> Worker:
        if self._share:
            with _kept_lock:
                idle = _kept.get(worker_kind(backend, self.options, self.sandbox, launcher))
                if idle:
                    worker, served = idle.pop()
                    self._served[id(worker)] = served
                    return worker
        worker = Worker(backend, self.options, self.sandbox, launcher=launcher)
        self._served[id(worker)] = 0
        return worker

    def _release(self, worker: Worker, keep: bool, canary: bool) -> None:
        served = self._served.get(id(worker), 0) + 1
        gpu = int(self.options.get("device_index", 0))
        if keep and served < MAX_STUDENTS and worker.alive and _ready(worker, canary, gpu):
            with _kept_lock:
                _kept.setdefault(worker._kind(), []).append((worker, served))
        else:
            worker.close()


def _ready(worker: Worker, canary: bool, gpu: int) -> bool:
    """Reset a worker for the next student; False where it cannot be trusted with one. The canary shares GPU
    `gpu` as a correctness run does, never while it times."""
    try:
        worker.call(forget, timeout=RESET_SECONDS)
        if canary:
            build = reference_build(worker.device, worker.sandbox, CANARY_STAGE)
            stage = get_stage(CANARY_STAGE)
            with gpu_gate(gpu, exclusive=False):
                value, findings, wrong = worker.call(run_case, build, CANARY_CASE, 256, timeout=RESET_SECONDS)
            if findings or wrong or value != case_reference(stage, CANARY_CASE, 256)[0]:
                return False
            worker.call(forget, timeout=RESET_SECONDS)
    except GraderError:
        return False
    worker.clear_log()
    return True


def close_kept() -> None:
    """Close every kept worker of this process (a test's, or a grader's at its end)."""
    with _kept_lock:
        idle = [worker for workers in _kept.values() for worker, _ in workers]
        _kept.clear()
    for worker in idle:
        worker.close()
