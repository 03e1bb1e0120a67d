"""The expected failures. Each says what went wrong, where, and what to do; anything else is a bug."""

from __future__ import annotations

from autograder.records import CompilerMessage, Finding


class GraderError(Exception):
    """Base of every expected failure."""


class NotebookError(GraderError):
    """A notebook cannot be read, or a stage's cell cannot be used."""


class CompileError(GraderError):
    """The kernel did not compile; `messages` holds the compiler's diagnostics as data."""

    def __init__(self, summary: str, messages: tuple[CompilerMessage, ...] = (), log: str = "") -> None:
        super().__init__(summary)
        self.messages = messages
        self.log = log

    def __reduce__(self):  # so the error crosses from the worker process intact
        return (type(self), (str(self), self.messages, self.log))


class KernelFault(GraderError):
    """A launch failed while running: an illegal address, a deadlock, a crash of the worker.

    `findings` carries what the backend saw (a deadlock's waiting threads, say).
    """

    def __init__(self, summary: str, findings: tuple[Finding, ...] = ()) -> None:
        super().__init__(summary)
        self.findings = findings

    def __reduce__(self):
        return (type(self), (str(self), self.findings))

    @property
    def deadlocked(self) -> bool:
        """Whether the backend saw every thread wait for ever: a kernel that never ends, a timeout on any backend."""
        return any(finding.kind == "deadlock" for finding in self.findings)


class KernelTimeout(GraderError):
    """A launch ran past its time limit and its worker was stopped."""


class BackendUnavailable(GraderError):
    """The backend asked for cannot run here (no GPU, no PyCUDA, no compiler)."""


class StartTimeout(BackendUnavailable):
    """A worker did not start within its limit: no student code runs then, so it is the machine's trouble (a
    stall, a GPU that makes no context), never a kernel's timeout."""


class ConfigError(GraderError):
    """A rubric or calibration file is missing or malformed."""
