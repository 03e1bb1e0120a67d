"""compute-sanitizer sessions shared by every grading process of a local cluster: one a tool and GPU.

A session is a sandboxed worker started under one tool (autograder.sanitizer). Kept in each grading process
(autograder.executors), a class of P processes kept 3P of them, each a CUDA context under the tool. At the start
of a class they were all made at once, and the driver makes contexts one at a time: with 16 processes on one
H100 each session took 22 s to start, and the first students waited for them (README, "Large classes"). The
host keeps one session a tool and GPU in the process that runs the class (autograder.batch), starts them while
the first students compile, and runs the kernels of every grading process in them.

- Who can ask: the host listens on a Unix socket in a folder of its own (mode 0700) and takes only connections
  that know its key; the grading processes get both with their students. Student code never reaches it: kernels
  run in sandboxed workers, whose /tmp is their own.
- What it runs: only what a shared session may run, a memory-safe kernel that cannot print (the asker decides,
  `sanitizer._sharing`); a grading process keeps sessions of its own for the rest.
- One run at a time in a session. The answer is why the run could not finish (None where it did) and the tool's
  report lines written during that run alone, which the asker reads as data (`sanitizer.parse_report`), as from
  a session of its own. The asker holds its GPU's gate (shared) while its run goes.
- After every run the session forgets the kernel (`verify.forget`: modules unloaded, buffers freed) and empties
  its output; after MAX_RUNS runs it is replaced. A kernel that memcheck stops ends the session's process,
  which is started again at once, outside any asker's hold of the GPU. A session that cannot start answers each
  run with why, as a session of the asker's own would; one whose start hung is tried again only after
  RETRY_SECONDS, not by every run of every asker in turn, each waiting isolation.STARTUP_SECONDS again.
  The kernel of an asker that has gone (its process lost) is not run: nobody holds the GPU's gate for it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, Client, Connection, Listener
from typing import Any

from autograder.errors import GraderError, StartTimeout
from autograder.isolation import Worker
from autograder.records import Build
from autograder.sanitizer import run_in
from autograder.verify import Case, forget

MAX_RUNS = 700  # runs a session serves before it is replaced (a kept worker's hundred students, seven stages each)
FORGET_SECONDS = 60.0
REPLY_SECONDS = 1800.0  # a run waits for the runs ahead of it in the session, each limited on its own
RETRY_SECONDS = 60.0  # a session whose start hung is started again after this long, not at every run

Answer = tuple[str | None, list[str]]  # (why the run could not finish, the report lines written during it)


@dataclass(frozen=True)
class Address:
    """Where the host listens, and the key a connection must know."""

    path: str
    key: bytes


class SessionHost:
    """The shared sessions of a class, one for each tool and GPU, served to the grading processes. `make(tool,
    gpu)` gives a fresh session (not started): a worker under that tool on that GPU."""

    def __init__(self, make: Callable[[str, int], Worker], tools: Iterable[str], gpus: Iterable[int]) -> None:
        self._folder = tempfile.mkdtemp(prefix="autograder-sessions-")  # mode 0700
        self.address = Address(os.path.join(self._folder, "socket"), secrets.token_bytes(32))
        try:
            self._listener = Listener(self.address.path, "AF_UNIX", authkey=self.address.key)
        except OSError:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self._sessions = {(tool, gpu): _Session(lambda t=tool, g=gpu: make(t, g)) for tool in tools for gpu in gpus}
        self._closed = False
        threading.Thread(target=self._accept, name="sessions", daemon=True).start()
        for session in self._sessions.values():  # started now, while the first students compile
            threading.Thread(target=session.start_ahead, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with suppress(OSError, EOFError, AuthenticationError):
            Client(self.address.path, "AF_UNIX", authkey=self.address.key).close()  # wakes the accepting thread
        self._listener.close()
        for session in self._sessions.values():
            session.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> SessionHost:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self._listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                continue  # a connection that did not know the key, or went away at once
            except OSError:
                return  # the listener was closed
            if self._closed:
                connection.close()
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: Connection) -> None:
        """Answer one grading process's requests, one after another, until it hangs up."""
        with connection:
            while True:
                try:
                    request = connection.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", self._answer(connection, *request))
                except GraderError as error:
                    reply = ("error", f"{type(error).__name__}: {error}")
                except Exception as error:  # a bug in the host: the asker's sanitizer phase fails, the host goes on
                    reply = ("error", "".join(traceback.format_exception(error)).rstrip())
                try:
                    connection.send(reply)
                except OSError:
                    return

    def _answer(self, connection: Connection, what: str, tool: str, gpu: int, *run: Any) -> Answer | None:
        session = self._sessions.get((tool, gpu))
        if session is None:
            raise GraderError(f"no shared {tool} session on GPU {gpu}")
        if what == "start":
            session.start_ahead()  # a session that cannot start says why at the run, as one of the asker's own
            return None
        build, case, block_size = run
        # The asker holds its GPU's gate while it waits for this answer. One that has gone (its process lost)
        # holds nothing: its kernel must not run, as it could run during another student's timing.
        return session.run(build, case, block_size, asking=lambda: _waiting(connection))


def _waiting(connection: Connection) -> bool:
    """Whether the asker on `connection` still waits for its answer: it sends nothing while it waits, so
    anything readable is its end of the connection."""
    try:
        return not connection.poll(0)
    except OSError:
        return False


class _Session:
    """One shared session, one run at a time."""

    def __init__(self, make: Callable[[], Worker]) -> None:
        self._make = make
        self._worker = make()
        self._runs = 0
        self._lock = threading.Lock()
        self._closed = False
        self._hung: tuple[float, str] | None = None  # when the session's start last hung, and why

    def start_ahead(self) -> None:
        """Start the session where it is not running, outside every asker's gate; a session that cannot start
        says why at the next run, as a session of the asker's own."""
        with self._lock:
            if not self._closed:
                self._start()

    def _start(self) -> str | None:
        """Start the session where it is not running: None, or why it cannot. A start that failed at once is
        tried again at the next run (a context the GPU could not make then, say); one that hung, only once
        RETRY_SECONDS have passed, each run until then answered with why at once."""
        if self._worker.alive:
            return None
        if self._hung is not None and time.monotonic() - self._hung[0] < RETRY_SECONDS:
            return self._hung[1]
        try:
            self._worker.start()
        except GraderError as error:
            why = str(error).splitlines()[0]
            if isinstance(error, StartTimeout):
                self._hung = time.monotonic(), why
            return why
        self._hung = None
        return None

    def run(self, build: Build, case: Case, block_size: int, asking: Callable[[], bool]) -> Answer:
        with self._lock:
            if self._closed:
                raise GraderError("the class's sessions were closed")
            if not asking():
                return "its grading process went away before its turn", []
            if self._runs >= MAX_RUNS:
                self._replace()
            why = self._start()
            if why is not None:
                return why, []
            self._runs += 1
            answer = run_in(self._worker, build, case, block_size, nullcontext)
            try:
                if self._worker.alive:
                    self._worker.call(forget, timeout=FORGET_SECONDS)
                self._worker.clear_log()
            except (GraderError, OSError):
                self._replace()
            ended = not self._worker.alive
        if ended:  # the kernel ended the session: started again now, not in the next asker's hold of the GPU
            threading.Thread(target=self.start_ahead, daemon=True).start()
        return answer

    def _replace(self) -> None:
        self._worker.close()
        self._worker = self._make()
        self._runs = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._worker.close()


class RemoteSession:
    """A grading process's way to a shared session: `run` as `sanitizer.run_in` runs in a session of its own."""

    def __init__(self, address: Address, tool: str, gpu: int) -> None:
        self.address, self.tool, self.gpu = address, tool, gpu
        self._connection: Connection | None = None

    def run(
        self, build: Build, case: Case, block_size: int, gate: Callable[[], AbstractContextManager[None]]
    ) -> Answer:
        self._ask("start")  # outside the gate: a session (re)starting takes seconds, which a timing must not wait
        with gate():
            failed, lines = self._ask("run", build, case, block_size)
        return failed, list(lines)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _ask(self, what: str, *run: Any) -> Any:
        try:
            if self._connection is None:
                self._connection = Client(self.address.path, "AF_UNIX", authkey=self.address.key)
            self._connection.send((what, self.tool, self.gpu, *run))
            if not self._connection.poll(REPLY_SECONDS):
                raise TimeoutError(f"no answer in {REPLY_SECONDS:g} s")
            status, payload = self._connection.recv()
        except (OSError, EOFError, AuthenticationError) as error:
            self.close()
            raise GraderError(f"the class's shared {self.tool} session cannot be reached: {error}") from None
        if status != "ok":
            raise GraderError(f"the class's shared {self.tool} session failed: {payload}")
        return payload
