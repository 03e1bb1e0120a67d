"""What a kernel that got hold of libc could try, run by a sandboxed worker (a module of its own, so the worker
can import it without the test module's reference kernels, which it cannot read)."""

from __future__ import annotations

import os
import socket
import subprocess


def try_to_escape(backend, marker: str) -> dict[str, str]:
    """Run in a sandboxed worker after its start: what a kernel that got hold of libc could try."""
    outcomes = {}
    for name, attempt in (
        ("system", lambda: os.system(f"touch {marker}")),
        ("spawn", lambda: subprocess.run(["true"])),
        ("fork", os.fork),
        ("socket", lambda: socket.socket(socket.AF_INET)),
        ("socketpair", socket.socketpair),
    ):
        try:
            outcomes[name] = f"allowed: {attempt()!r}"
        except OSError as error:
            outcomes[name] = f"refused: {error.errno}"
    return outcomes


def try_to_reach(backend, path: str) -> tuple[bool, str]:
    """Run in a sandboxed worker: whether a Unix socket of the grader's (the class's compute-sanitizer sessions)
    can be seen at `path`, and what connecting to it gives."""
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
        reached = "connected"
    except OSError as error:
        reached = f"refused: {error.errno}"
    return os.path.exists(path), reached
