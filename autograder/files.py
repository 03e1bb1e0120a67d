"""Reading a file the grader did not write (a hand-in; a result file someone may have edited): a regular file
only, never through a symbolic link, never waiting on a FIFO, and no more of it than a bound."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; else OSError, its strerror saying why:
    ELOOP for a symbolic link (never followed), EINVAL for a folder, a FIFO or another special file, EFBIG for a
    file larger than `limit`, or what the system said."""
    return b"".join(_regular_file_chunks(path, limit))


def regular_file_sha256(path: Path, limit: int) -> str:
    """The SHA-256 of the regular file at `path`, read as `read_regular_file` reads it (the same refusals), a
    chunk at a time, so hashing a hand-in never holds more than a chunk of it."""
    digest = hashlib.sha256()
    for chunk in _regular_file_chunks(path, limit):
        digest.update(chunk)
    return digest.hexdigest()


def _regular_file_chunks(path: Path, limit: int) -> Iterator[bytes]:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, which is not followed", str(path)) from None
        raise
    size = 0
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        while size <= limit and (chunk := os.read(descriptor, min(1 << 20, limit + 1 - size))):
            size += len(chunk)
            if size <= limit:
                yield chunk
    finally:
        os.close(descriptor)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // (1024 * 1024)} MiB", str(path))
