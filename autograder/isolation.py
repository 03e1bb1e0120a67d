"""Running kernels in a worker process with time limits, so no student kernel can hang or crash the grader.

A Worker owns one child process that holds a backend (and, on the GPU, its CUDA context). `call(fn, *args)`
runs `fn(backend, *args)` there. If the call runs past its time limit the child is killed and KernelTimeout is
raised; if the child dies (a segfault, a sticky CUDA error) KernelFault is raised. Either way the next call
starts a fresh child, so grading goes on with the next stage and the next student.

The child runs inside the sandbox (autograder.sandbox): it sees none of the grader's files and, once its
backend is up, can start no program. Calls go to it pickled (the grader's own data); its replies come back as
JSON checked against the record shapes (autograder.wire), because student code runs in it. A reply that is
not valid ends the child, as a crash does.

The child's stdout and stderr go to a log file, never to the grader's terminal or a notebook's stderr: a
kernel's printf and the driver's complaints are kept for the error message instead. The log is removed when
the worker closes, however it ends.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import typing
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autograder import sandbox as sandboxing
from autograder.backends import create_backend
from autograder.errors import GraderError, KernelFault, KernelTimeout, StartTimeout
from autograder.records import DeviceInfo
from autograder.wire import MAX_REPLY_BYTES, WireError, check, decode_reply, encode_reply, printable

if TYPE_CHECKING:
    from autograder.backends.cpu.compiler import Toolchain

STARTUP_SECONDS = 120.0  # creating a CUDA context or compiling the CPU runtime the first time
LOG_TAIL_CHARS = 2000
# What each kind of worker said it runs on when it started, in this process: a later worker of the same kind
# can say so without starting, and a student whose stages all come from the class memo starts no CUDA context
# (seconds of CPU each). Said by fresh workers only, before any student code ran in them.
_DEVICES: dict[str, DeviceInfo] = {}


class BudgetSpent(KernelTimeout):
    """Calls sent together ran past the time they may take together (`Worker.call_each`'s budget)."""


class _Budget:
    """The time calls sent together may take (`Worker.call_each`'s budget), from the first sent: the time that is
    no call's (a fresh worker's start, a wait for the GPU) moves its end on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._ends: float | None = None

    def start(self) -> None:
        if self._ends is None:
            self._ends = time.monotonic() + self.seconds

    def left(self) -> float:
        assert self._ends is not None
        return self._ends - time.monotonic()

    def move_on(self, since: float) -> None:
        """Leave out of the budget the time from `since` until now."""
        if self._ends is not None:
            self._ends += time.monotonic() - since


class CallTimeout(KernelTimeout):
    """A call ran past its own limit. `busy`: its worker runs the CPU backend and ran on a core at least half the
    time the grader waited for the call's reply (`Worker._receive`)."""

    def __init__(self, message: str, busy: bool) -> None:
        super().__init__(message)
        self.busy = busy


class Worker:
    """One isolated child process with a backend. Use as a context manager, or call `close`."""

    def __init__(
        self,
        backend: str = "auto",
        options: dict[str, Any] | None = None,
        sandbox: sandboxing.Sandbox | None = None,
        readable: tuple[Path, ...] = (),
        launcher: tuple[str, ...] = (),
    ) -> None:
        """`sandbox`: how student code is isolated (default: sandboxed); `readable`: extra folders the worker
        may read, for the trusted modules of a test or a benchmark whose functions it runs; `launcher`: a
        program that starts the worker's interpreter (compute-sanitizer), inside the same sandbox."""
        self.backend_name = backend
        self.options = dict(options or {})
        self.sandbox = sandbox or sandboxing.Sandbox()
        self.readable = readable
        self.launcher = launcher
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        handle, log = tempfile.mkstemp(prefix="autograder-worker-", suffix=".log")
        os.close(handle)  # the child writes it, the grader reads it by name: an open descriptor kept here is a leak
        self._log = Path(log)
        self._device: DeviceInfo | None = None
        self._output_from = 0  # where in the output file the current call's (or start's) output begins
        self._starting = threading.Lock()
        self.restarts = 0
        self._pids: tuple[int, ...] | None = None  # the processes of a started CPU-backend child (`_cpu_seconds`)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def device(self) -> DeviceInfo:
        """What the backend runs on: as the last worker of this kind in this process said, else the child's
        own word (starting it)."""
        if self._device is None and self._kind() in _DEVICES:
            return _DEVICES[self._kind()]
        self._ensure_started()
        assert self._device is not None
        return self._device

    @property
    def known(self) -> bool:
        """Whether `device` answers without starting the child."""
        return self._device is not None or self._kind() in _DEVICES

    def _kind(self) -> str:
        return worker_kind(self.backend_name, self.options, self.sandbox, self.launcher)

    def start(self) -> None:
        """Start the child now, if it is not running: before a caller takes a lock that a slow start (a CUDA
        context, seconds when many start at once) would hold up for others."""
        self._ensure_started()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """`fn(backend, *args)` in the child, within `timeout` seconds. `fn` must be a module-level function."""
        return next(self._calls(fn, [args], [timeout], many=False))

    def call_each(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        timeouts: Sequence[float],
        budget: float | None = None,
        confirm: bool = False,
        hold: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> Generator[Any, None, None]:
        """`fn(backend, *args)` for each `args` of `calls` in turn, in one message to the child: each result as it
        comes, each within its own timeout (counted from the result before it), and all of them within `budget`
        seconds where one is given. The child stops at the first call that raises, and so does the iteration, with
        that call's error; a caller that stops taking results early stops the worker, whose next call starts a
        fresh one.

        With `hold` (the GPU's gate, shared), each call is sent in a message of its own, inside `hold()`, so that a
        timing waits for one call to end, not for all of them; the waits for it count toward no limit.

        With `confirm`, a call past its own limit is confirmed before that is the answer: it and the calls after
        it are sent again, once, to a fresh child, that call with twice its time, all still within `budget`
        (never confirmed: it bounds what a kernel slowed on purpose costs). A stall of the machine (the driver's
        lock while many CUDA contexts start or end, the kernel's clean-up of the sandboxes' namespaces) holds a
        call up as long as a hang does; a call past its limit twice is a hang. On the CPU backend the kernel runs on
        the worker's own cores, so there a call past its limit whose worker was busy is a hang at once
        (`CallTimeout.busy`)."""
        limit = None if budget is None else _Budget(budget)
        if not confirm:
            return self._calls(fn, calls, timeouts, many=True, budget=limit, hold=hold)
        return self._confirmed(fn, calls, timeouts, limit, hold)

    def _confirmed(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        timeouts: Sequence[float],
        budget: _Budget | None,
        hold: Callable[[], AbstractContextManager[None]] | None,
    ) -> Generator[Any, None, None]:
        taken = 0
        try:
            for value in self._calls(fn, calls, timeouts, many=True, budget=budget, hold=hold):
                taken += 1
                yield value
            return
        except BudgetSpent:
            raise
        except KernelTimeout as error:
            if isinstance(error, CallTimeout) and error.busy:
                raise  # a hang: a second try would only make it cost three times its limit
            first, stopped = str(error), taken
        again = [2 * timeouts[taken], *timeouts[taken + 1 :]]
        rest = calls[taken:]
        self._stop()  # fresh, even where the child itself answered with a timeout
        started = time.monotonic()
        self._ensure_started()
        if budget is not None:
            budget.move_on(started)  # the budget is the calls', not the fresh child's start
        try:
            for value in self._calls(fn, rest, again, many=True, budget=budget, before=taken, hold=hold):
                taken += 1
                yield value
        except BudgetSpent:
            raise
        except KernelTimeout as error:
            if taken == stopped:
                why = f"{first}; the second try, in a fresh worker with {again[0]:g} s, ran past its time too"
            else:
                why = f"{error} (in a second try, in a fresh worker, after: {first})"
            raise KernelTimeout(why) from None

    def _cpu_seconds(self) -> float | None:
        """How long the worker's processes ran on a core so far, where it runs the CPU backend: there the kernel
        runs on the worker's own cores, so a worker held up by the machine (a stall in the kernel, SIGSTOP) runs
        little, and a kernel that hangs keeps it running. A GPU worker waits for its GPU, where a stalled GPU and a
        hung kernel look alike: None, as for a child starting. Its processes are found once, when it has started:
        a started worker starts none."""
        return None if self._pids is None else sandboxing.active_seconds(self._pids, waiting=False)

    def _calls(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        timeouts: Sequence[float],
        many: bool,
        budget: _Budget | None = None,
        before: int = 0,
        hold: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> Generator[Any, None, None]:
        """The calls' replies, within `budget` where one is given (counted from the first calls sent: a budget
        passed on to a second try goes on); `before` of the calls it bounds were answered earlier. With `hold`,
        each call is sent alone, inside `hold()`, and the waits for it count toward no limit."""
        self._ensure_started()
        if budget is not None:
            budget.start()
        what = getattr(fn, "__name__", "call")
        shape = typing.get_type_hints(fn).get("return", Any)
        bound = before + len(calls)  # the calls the budget bounds, an earlier try's among them
        messages = [range(len(calls))] if hold is None else [range(index, index + 1) for index in range(len(calls))]
        taken = 0
        pending = 0  # replies on their way: none where the child stopped at a call that raised, or was stopped
        try:
            for message in messages:
                with _holding(hold, budget):
                    self._send(fn, [calls[index] for index in message], many, what)
                    pending = len(message)
                    for index in message:
                        try:
                            value = self._reply(what, shape, timeouts[index], budget, before + taken, bound)
                        except GraderError:
                            pending = 0
                            raise
                        taken += 1
                        pending -= 1
                        yield value
        finally:
            if pending and self._alive():
                self._stop()  # replies still on their way would be read as a later call's

    def _send(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], many: bool, what: str) -> None:
        """Send calls to the child. One that has died since its last reply (killed from outside, its memory run
        out) is a fault, as where it dies during a call."""
        assert self._connection is not None
        self._output_from = self.log_size()
        try:
            self._connection.send((_importable(fn), calls if many else calls[0], many))
        except OSError:
            raise self._died(what) from None

    def _reply(self, what: str, shape: Any, timeout: float, budget: _Budget | None, answered: int, bound: int) -> Any:
        """The next call's reply, within its `timeout` and what is left of `budget` (`answered` of the `bound`
        calls it bounds, an earlier try's among them, were answered before it)."""
        left = timeout if budget is None else min(timeout, budget.left())
        try:
            reply = self._receive(max(left, 0.0), what=what)
        except KernelTimeout:
            if budget is not None and left < timeout:  # the calls' budget, not this call's own limit, ran out
                raise BudgetSpent(
                    f"the {bound} runs ran past the {budget.seconds:g} s they may take together and were stopped "
                    f"after {answered} of them (a kernel far slower than it should be?)"
                ) from None
            raise
        try:
            return check(shape, reply)
        except WireError as error:
            self._stop()
            raise KernelFault(f"the worker sent an invalid reply to {what} ({error}): it was stopped") from None

    def close(self) -> None:
        self.shut_down()
        self._log.unlink(missing_ok=True)

    def shut_down(self, wait: float = 5.0) -> None:
        """Ask the worker to exit and wait up to `wait` seconds (a launcher prints its summary then)."""
        if self._alive():
            try:
                assert self._connection is not None and self._process is not None
                self._connection.send(None)
                self._process.wait(timeout=wait)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                pass
        self._stop()

    def report_lines(self, prefix: str, start: int = 0, most: int | None = None) -> list[str]:
        """The lines of the worker's output from byte `start` on (a `log_size` taken earlier) that start with
        `prefix` (without it): a launcher's report, read as data; the first `most` of them where given. The whole
        output is read, which the worker's file limit keeps to 64 MiB, so what the student's kernel printed, with
        the prefix or without, cannot push the report out of reach."""
        found: list[str] = []
        try:
            with open(self._log, "rb") as log:
                log.seek(start)
                for raw in log:
                    if raw.startswith(prefix.encode()):
                        found.append(raw[len(prefix) :].decode(errors="replace").rstrip("\n"))
                        if len(found) == most:
                            break
        except OSError:
            pass
        return found

    def log_size(self) -> int:
        """How many bytes the worker's output holds so far."""
        try:
            return self._log.stat().st_size
        except OSError:
            return 0

    def clear_log(self) -> None:
        """Empty the worker's output file, which the child keeps appending to: a worker that serves many
        students never reaches its file-size limit because of what earlier students' kernels printed."""
        with open(self._log, "r+b") as log:
            log.truncate(0)

    @property
    def alive(self) -> bool:
        """Whether the child process is running (a timeout or a fault stops it)."""
        return self._alive()

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _ensure_started(self) -> None:
        with self._starting:  # a worker started ahead in another thread is waited for, not started twice
            self._start_if_stopped()

    def _start_if_stopped(self) -> None:
        if self._alive():
            return
        self._stop()
        if self._device is not None:
            self.restarts += 1  # it ran before: a timeout or a crash stopped it
        # A fresh interpreter running this module, rather than multiprocessing's spawn, which would import the
        # caller's main script again (a script or notebook without a __main__ guard would run twice).
        ours, theirs = socket.socketpair()
        self._output_from = self.log_size()
        options, runtime = _worker_options(self.backend_name, {**self.options, "sandbox": self.sandbox.enabled})
        try:
            self._process = self.sandbox.start_worker(
                [*self.launcher, sys.executable, "-m", "autograder.isolation", str(theirs.fileno())],
                log=self._log,
                channel=theirs,
                gpu=self.backend_name in ("gpu", "auto"),
                readable=(*runtime, *self.readable) if self.sandbox.enabled else (),
            )
        finally:
            theirs.close()
        self._connection = Connection(ours.detach())
        try:
            self._connection.send((sys.path, self.backend_name, options))
            self._device = _DEVICES[self._kind()] = self._receive(STARTUP_SECONDS, what="starting the backend")
            if self._device.backend == "cpu":  # its processes, all there now that it runs (`_cpu_seconds`)
                self._pids = tuple(sandboxing.processes_under(self._process.pid))
        except BaseException as error:
            self._stop()  # a child that did not start is not left running: the next use starts it again
            if isinstance(error, KernelTimeout):
                raise StartTimeout(str(error)) from None
            raise

    def _receive(self, timeout: float, what: str) -> Any:
        assert self._connection is not None and self._process is not None
        waited, ran = time.monotonic(), self._cpu_seconds()
        try:
            ready = self._connection.poll(timeout)
        except (OSError, EOFError):
            ready = True  # the child closed its end: reading below finds out why
        if not ready:
            busy = ran is not None and (self._cpu_seconds() or 0.0) - ran >= (time.monotonic() - waited) / 2
            self._stop()
            why = f"{what} ran past its {timeout:g} s limit and was stopped (a hang or a spin-wait?)"
            raise CallTimeout(why, busy)
        try:
            status, payload = decode_reply(self._connection.recv_bytes(MAX_REPLY_BYTES))
        except WireError as error:
            self._stop()
            raise KernelFault(f"the worker sent an invalid reply during {what} ({error}): it was stopped") from None
        except (EOFError, OSError):
            raise self._died(what) from None
        if status == "error":
            if isinstance(payload, KernelFault):
                self._stop()  # after a device fault (an illegal address is sticky) start clean
            raise payload
        return payload

    def _died(self, what: str) -> KernelFault:
        """The fault of a child that died during `what`, its end and its last output said; it is stopped."""
        assert self._process is not None
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stop()
        return KernelFault(f"the worker died during {what}: {_describe_exit(code)}{self._log_tail()}")

    def _log_tail(self) -> str:
        """The end of what the worker printed during the call that failed (never an earlier call's: that may
        have been another stage's, or another student's), safe to show in a terminal."""
        try:
            with open(self._log, "rb") as log:
                log.seek(max(self._output_from, log.seek(0, os.SEEK_END) - 4 * LOG_TAIL_CHARS))
                text = log.read().decode(errors="replace")[-LOG_TAIL_CHARS:].strip()
        except OSError:
            return ""
        return f"\n{printable(text)}" if text else ""

    def _stop(self) -> None:
        if self._process is not None:
            sandboxing.kill_group(self._process)
        if self._connection is not None:
            self._connection.close()
        self._process = None
        self._connection = None
        self._pids = None


@contextmanager
def _holding(hold: Callable[[], AbstractContextManager[None]] | None, budget: _Budget | None) -> Iterator[None]:
    """Inside `hold()` where there is one (the GPU's gate), the wait for it left out of `budget`."""
    if hold is None:
        yield
        return
    asked = time.monotonic()
    with hold():
        if budget is not None:
            budget.move_on(asked)  # waiting for the GPU is no call's time
        yield


def worker_kind(backend: str, options: dict[str, Any], sandbox: sandboxing.Sandbox, launcher: tuple[str, ...]) -> str:
    """What makes two workers alike: the same backend, options, isolation and launcher."""
    return repr((backend, sorted(options.items()), sandbox.enabled, launcher))


def _importable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, or for a function of a script run as `__main__`, the same function of that script imported as a
    module, which the worker can find by name (the script's folder is on the path it is given)."""
    if getattr(fn, "__module__", None) != "__main__":
        return fn
    script = getattr(sys.modules["__main__"], "__file__", None)
    if script is None:
        raise GraderError(f"{fn.__name__} is defined in an interactive session: define it in a module")
    return getattr(importlib.import_module(Path(script).stem), fn.__name__)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it did not exit"
    if code > 128:
        code = 128 - code  # the sandbox reports its child's death by a signal as 128 + the signal's number
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _serve(connection: Connection) -> None:
    """The child's loop: build the backend, then run calls until told to stop."""
    sys_path, backend_name, options = connection.recv()
    sys.path[:] = sys_path  # so functions of the caller's modules (a test's, a benchmark's) can be unpickled
    try:
        backend = create_backend(backend_name, **options)
        if options.get("sandbox"):
            sandboxing.restrict_worker()
        _reply(connection, "ok", backend.device())
    except GraderError as error:
        _reply(connection, "error", error)
        return
    except Exception as error:  # a bug in a backend: report it rather than die silently
        _reply(connection, "error", GraderError(f"the backend failed to start: {error!r}\n{traceback.format_exc()}"))
        return
    try:
        while True:
            try:
                message = connection.recv()
            except EOFError:
                break
            except Exception as error:  # a call that cannot be unpickled here
                _reply(connection, "error", GraderError(f"the worker cannot take this call: {error!r}"))
                continue
            if message is None:
                break
            fn, args, many = message
            for one in args if many else [args]:
                try:
                    _reply(connection, "ok", fn(backend, *one))
                except GraderError as error:
                    _reply(connection, "error", error)
                    break
                except Exception as error:
                    report = f"internal error in {fn.__name__}: {error!r}\n{traceback.format_exc()}"
                    _reply(connection, "error", GraderError(report))
                    break
    finally:
        backend.close()  # a CUDA context left on the stack aborts the interpreter at exit


def _reply(connection: Connection, status: str, payload: Any) -> None:
    try:
        data = encode_reply(status, payload)
    except TypeError as error:  # a value the wire does not carry: a bug in the function called
        data = encode_reply("error", GraderError(f"the worker cannot send its result: {error}"))
    connection.send_bytes(data)


def _worker_options(backend: str, options: dict[str, Any]) -> tuple[dict[str, Any], tuple[Path, ...]]:
    """The options with what the grader decides made explicit, and the files of the grader's cache the worker
    must read. A sandboxed worker starts with an empty environment, its own home and a read-only view, so the
    CPU backend's runtime is built here first, and the worker is told the toolchain that built it; a GPU
    worker is handed the timing helper, compiled once here, and may read the timing inputs the grader publishes.
    `auto` gets both: the worker takes what its backend takes (autograder.backends.create_backend)."""
    readable: tuple[Path, ...] = ()
    if backend in ("gpu", "auto"):
        options = _with_timing_helper(options)
        readable = _timing_inputs()
    if backend in ("cpu", "auto"):
        options, runtime = _with_cpu_runtime(options)
        readable += runtime
    return options, readable


def _with_timing_helper(options: dict[str, Any]) -> dict[str, Any]:
    from autograder.backends.gpu import find_nvcc, hold_ptx

    nvcc = options.get("nvcc") or find_nvcc()
    try:
        return {**options, "hold": hold_ptx(nvcc)} if nvcc else options
    except GraderError:
        return options  # the worker's backend says why when it starts


def _timing_inputs() -> tuple[Path, ...]:
    """The folder of timing inputs the grader publishes (autograder.timing.publish_input), made now so that it can
    be bound: the worker reads them rather than drawing its own."""
    from autograder.timing import input_folder

    folder = input_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ()  # not writable here: the worker draws its own
    return (folder,)


def _with_cpu_runtime(options: dict[str, Any]) -> tuple[dict[str, Any], tuple[Path, ...]]:
    try:
        toolchain = cpu_toolchain(options)
    except GraderError:
        return options, ()  # no CPU backend here: the worker says why when it starts
    return {**options, "toolchain": toolchain}, (toolchain.runtime, toolchain.runtime.with_suffix(".json"))


def cpu_toolchain(options: Mapping[str, Any]) -> Toolchain:
    """The CPU backend's toolchain for a worker with these backend options, its runtime built (once a machine)."""
    from autograder.backends.cpu.compiler import cache_directory, prepare_toolchain

    fibers = options.get("fibers") or os.environ.get("AUTOGRADER_CPU_FIBERS") or "auto"
    return prepare_toolchain(fibers, Path(options.get("cache_dir") or cache_directory()))


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
