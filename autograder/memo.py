"""Identical kernels are graded once per class: a stage's result, kept by a hash of everything it depends on.

Many students hand in the lecture's kernel unchanged. A stage's result depends only on its source (and the
cell line it starts on, which its messages name), its baseline for the speedup (the student's own previous
stage's source when that one is correct, else the reference), and the run's settings: the seed, the rubric,
the device, the isolation and the grader's version. Two students whose stage agrees in all of these get the
same result; the second one reads it from here instead of compiling, checking and timing again.

What a stage's checks find (correctness, the race analysis, the technique, compute-sanitizer) does not depend
on the baseline, so it is kept on its own, without it: a kernel handed in by many students over different
baselines is checked once and only timed again. The memo is a folder of JSON files written only by the grader,
one per result, each written atomically.

Students graded at the same time (a local or a Dask cluster sharing the results folder) often need the same
result at once: the lecture's kernel, by every worker in the first seconds of a class. `claim` makes the
second one wait for the first and read its result, instead of making it again.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from autograder import __version__
from autograder.records import StageResult, from_dict, to_dict

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def grader_version() -> str:
    """The package version and a hash of its code, rubric and runtime: results of an older grader, even of the
    same version number, are neither kept by --resume nor taken from the memo."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".h", ".cpp", ".toml", ".json", ".j2"):
            digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


class StageMemo:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    def key(*parts: object) -> str:
        return hashlib.sha256(json.dumps([str(part) for part in parts]).encode()).hexdigest()

    def get(self, key: str, record: type = StageResult) -> Any:
        """The `record` kept under `key` (a StageResult unless said), or None."""
        try:
            return from_dict(record, json.loads((self.folder / f"{key}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @contextmanager
    def claim(self, keys: list[str]) -> Iterator[None]:
        """Hold `keys` while their results are made: another process claiming one of them waits until this
        one is done, then finds the result with `get`. Keys are taken in sorted order, so claims never
        deadlock; a process that dies lets go of its keys."""
        locks = self.folder / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with ExitStack() as held:
            for key in sorted(set(keys)):
                handle = held.enter_context(open(locks / key, "a"))
                fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def put(self, key: str, result: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(to_dict(result), out, allow_nan=True)
        os.replace(temporary, self.folder / f"{key}.json")
