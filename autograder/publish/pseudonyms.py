"""Pseudonyms for publishing: the same name for a student every time, and no way back to the student.

A pseudonym is an HMAC-SHA256 of the student id under a secret salt, written as two words and four hex digits
("amber-otter-3f2a"). Without the salt nobody can test a guessed id against it; with the same salt, the same
student gets the same name on every leaderboard of the course. The salt is given by the TA or kept in a file
next to the results, created on first use; that file must never be published.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from autograder.errors import GraderError

SALT_FILE = "pseudonym-salt.txt"

_ADJECTIVES = (
    "amber", "azure", "bold", "brave", "bright", "calm", "clever", "coral", "crimson", "curious", "daring",
    "eager", "fierce", "gentle", "golden", "happy", "hidden", "humble", "indigo", "jade", "jolly", "keen",
    "lively", "lucky", "mellow", "misty", "nimble", "noble", "olive", "patient", "quick", "quiet", "rapid",
    "rosy", "rustic", "sage", "scarlet", "silent", "silver", "sleek", "snowy", "steady", "stormy", "sunny",
    "swift", "teal", "tidy", "topaz", "vivid", "wise", "witty", "zesty",
)
_ANIMALS = (
    "badger", "beaver", "bison", "crane", "dingo", "dolphin", "eagle", "falcon", "ferret", "finch", "fox",
    "gecko", "heron", "ibex", "jackal", "koala", "lemur", "lynx", "marmot", "marten", "moose", "newt",
    "ocelot", "orca", "osprey", "otter", "owl", "panda", "pelican", "puffin", "quail", "raven", "robin",
    "salmon", "seal", "shrew", "sparrow", "stoat", "swan", "tapir", "tern", "tiger", "toucan", "trout",
    "turtle", "walrus", "weasel", "whale", "wolf", "wombat", "yak", "zebra",
)


class PseudonymError(GraderError):
    """Pseudonyms cannot be made: no usable salt, or two students would share one."""


def pseudonym(student: str, salt: str) -> str:
    """The published name of `student` under `salt`."""
    digest = hmac.new(salt.encode("utf-8"), student.encode("utf-8"), hashlib.sha256).digest()
    adjective = _ADJECTIVES[int.from_bytes(digest[0:4], "big") % len(_ADJECTIVES)]
    animal = _ANIMALS[int.from_bytes(digest[4:8], "big") % len(_ANIMALS)]
    return f"{adjective}-{animal}-{digest[8:10].hex()}"


def pseudonyms(students: Iterable[str], salt: str) -> dict[str, str]:
    """Each student's pseudonym; a clash (about one in 180 million per pair) is refused, not published."""
    names: dict[str, str] = {}
    owners: dict[str, str] = {}
    for student in students:
        name = pseudonym(student, salt)
        if name in owners and owners[name] != student:
            raise PseudonymError(f"students {owners[name]!r} and {student!r} would share the pseudonym {name!r}; "
                                 "choose another salt")
        owners[name] = student
        names[student] = name
    return names


def resolve_salt(results_folder: Path, salt: str | None = None, salt_file: Path | None = None) -> str:
    """The salt to use: the one given, else the salt file's, else a new one saved in the results folder.

    Saving it keeps the pseudonyms stable from one run to the next; a TA who wants them stable across
    courses or machines passes the same --salt or --salt-file each time.
    """
    if salt is not None:
        if not salt.strip():
            raise PseudonymError("the pseudonym salt is empty; give a secret string, or leave --salt out")
        return salt
    path = Path(salt_file) if salt_file is not None else Path(results_folder) / SALT_FILE
    text = read_salt_file(path)
    if text is not None:
        if not text:
            raise PseudonymError(f"{path}: the pseudonym salt file is empty; delete it to make a new one")
        return text
    if salt_file is not None:
        raise PseudonymError(f"{path}: no such salt file; create it with a secret line, or leave --salt-file out")
    text = secrets.token_hex(16)
    try:
        with path.open("x", encoding="utf-8") as handle:  # "x": never through a link left in its place
            handle.write(text + "\n")
    except OSError as error:
        raise PseudonymError(f"{path}: cannot keep a new pseudonym salt there ({error.strerror}); give the salt "
                             "with --salt or --salt-file") from None
    return text


def read_salt_file(path: Path) -> str | None:
    """The salt kept in the file `path`, stripped ("" where it is empty), or None where there is no such file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise PseudonymError(f"{path}: the salt file is a link to nothing; remove it") from None
        return None
    except OSError as error:
        raise PseudonymError(f"{path}: cannot read the pseudonym salt file ({error.strerror})") from None
    if not stat.S_ISREG(mode):  # a folder, or a FIFO that would block the command
        raise PseudonymError(f"{path}: the pseudonym salt file is not a regular file; move it away, or give "
                             "--salt-file")
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise PseudonymError(f"{path}: cannot read the pseudonym salt file ({reason})") from None
