"""Reading a file the grader did not write (a hand-in; a result file someone may have edited): a regular file
only, never through a symbolic link, never waiting on a FIFO, and no more of it than a bound."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; else OSError, its strerror saying why:
    ELOOP for a symbolic link (never followed), EINVAL for a folder, a FIFO or another special file, EFBIG for a
    file larger than `limit`, or what the system said."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, which is not followed", str(path)) from None
        raise
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(descriptor, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // (1024 * 1024)} MiB", str(path))
    return b"".join(chunks)
