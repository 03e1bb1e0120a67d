"""Running kernels in a worker process with time limits, so no student kernel can hang or crash the grader.

A Worker owns one child process that holds a backend (and, on the GPU, its CUDA context). `call(fn, *args)`
runs `fn(backend, *args)` there. If the call runs past its time limit the child is killed and KernelTimeout is
raised; if the child dies (a segfault, a sticky CUDA error) KernelFault is raised. Either way the next call
starts a fresh child, so grading goes on with the next stage and the next student.

The child's stdout and stderr go to a log file, never to the grader's terminal or a notebook's stderr: a
kernel's printf and the driver's complaints are kept for the error message instead.
"""

from __future__ import annotations

import importlib
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from autograder.backends import create_backend
from autograder.errors import GraderError, KernelFault, KernelTimeout
from autograder.records import DeviceInfo

STARTUP_SECONDS = 120.0  # creating a CUDA context or compiling the CPU runtime the first time
LOG_TAIL_CHARS = 2000


class Worker:
    """One isolated child process with a backend. Use as a context manager, or call `close`."""

    def __init__(self, backend: str = "auto", options: dict[str, Any] | None = None) -> None:
        self.backend_name = backend
        self.options = dict(options or {})
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self._log = Path(tempfile.mkstemp(prefix="autograder-worker-", suffix=".log")[1])
        self._device: DeviceInfo | None = None
        self.restarts = 0

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def device(self) -> DeviceInfo:
        """What the backend runs on (starts the child if needed)."""
        self._ensure_started()
        assert self._device is not None
        return self._device

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """`fn(backend, *args)` in the child, within `timeout` seconds. `fn` must be a module-level function."""
        self._ensure_started()
        assert self._connection is not None
        self._connection.send((_importable(fn), args))
        return self._receive(timeout, what=getattr(fn, "__name__", "call"))

    def close(self) -> None:
        if self._alive():
            try:
                assert self._connection is not None and self._process is not None
                self._connection.send(None)
                self._process.wait(timeout=5)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                pass
        self._stop()
        self._log.unlink(missing_ok=True)

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _ensure_started(self) -> None:
        if self._alive():
            return
        self._stop()
        if self._device is not None:
            self.restarts += 1  # it ran before: a timeout or a crash stopped it
        # A fresh interpreter running this module, rather than multiprocessing's spawn, which would import the
        # caller's main script again (a script or notebook without a __main__ guard would run twice).
        ours, theirs = socket.socketpair()
        with open(self._log, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "autograder.isolation", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        theirs.close()
        self._connection = Connection(ours.detach())
        self._connection.send((sys.path, self.backend_name, self.options))
        self._device = self._receive(STARTUP_SECONDS, what="starting the backend")

    def _receive(self, timeout: float, what: str) -> Any:
        assert self._connection is not None and self._process is not None
        try:
            ready = self._connection.poll(timeout)
        except (OSError, EOFError):
            ready = True  # the child closed its end: reading below finds out why
        if not ready:
            self._stop()
            raise KernelTimeout(f"{what} ran past its {timeout:g} s limit and was stopped (a hang or a spin-wait?)")
        try:
            status, payload = self._connection.recv()
        except (EOFError, OSError):
            try:
                code = self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self._stop()
            raise KernelFault(f"the worker died during {what}: {_describe_exit(code)}{self._log_tail()}") from None
        if status == "error":
            if isinstance(payload, KernelFault):
                self._stop()  # after a device fault (an illegal address is sticky) start clean
            raise payload
        return payload

    def _log_tail(self) -> str:
        try:
            text = self._log.read_text(errors="replace")[-LOG_TAIL_CHARS:].strip()
        except OSError:
            return ""
        return f"\n{text}" if text else ""

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(timeout=10)
        if self._connection is not None:
            self._connection.close()
        self._process = None
        self._connection = None


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
        connection.send(("ok", backend.device()))
    except GraderError as error:
        connection.send(("error", error))
        return
    except Exception as error:  # a bug in a backend: report it rather than die silently
        connection.send(("error", GraderError(f"the backend failed to start: {error!r}\n{traceback.format_exc()}")))
        return
    try:
        while True:
            try:
                message = connection.recv()
            except EOFError:
                break
            except Exception as error:  # a call that cannot be unpickled here
                connection.send(("error", GraderError(f"the worker cannot take this call: {error!r}")))
                continue
            if message is None:
                break
            fn, args = message
            try:
                connection.send(("ok", fn(backend, *args)))
            except GraderError as error:
                connection.send(("error", error))
            except Exception as error:
                report = f"internal error in {fn.__name__}: {error!r}\n{traceback.format_exc()}"
                connection.send(("error", GraderError(report)))
    finally:
        backend.close()  # a CUDA context left on the stack aborts the interpreter at exit


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
