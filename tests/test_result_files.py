"""Result files that were hand-edited or damaged: each stops leaderboard, feedback and export with one error that
names the file and the key (exit status 1, a configuration error), never a traceback, a hang or a wrong total."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from publish_class import make_class, write_results

from autograder.cli import cli
from autograder.publish import results as results_module
from autograder.publish.pseudonyms import SALT_FILE
from autograder.publish.results import ResultsError, load_results
from autograder.records import to_dict

COMMANDS = ("leaderboard", "feedback", "export")


def edited(change: Callable[[dict[str, Any]], object]) -> str:
    """ada's result file, after `change` edited its data."""
    data = to_dict(next(r for r in make_class() if r.student == "ada"))
    change(data)
    return json.dumps(data)


def first_points(data: dict[str, Any]) -> dict[str, Any]:
    return data["stages"][0]["points"]


EDITS: dict[str, tuple[str, str]] = {  # name: (the file's text, what the error must say)
    "a stage twice": (edited(lambda d: d["stages"].append(d["stages"][1])),
                      "/stages/8/stage: a second entry for stage 'anti_divergence' (the first is /stages/1)"),
    "an unknown stage": (edited(lambda d: d["stages"][0].update(stage="warp9")), "/stages/0/stage: no stage 'warp9'"),
    "points as a string": (edited(lambda d: first_points(d).update(correctness="10")),
                           '/stages/0/points/correctness: a number is needed, not "10"'),
    "points not a number": (edited(lambda d: first_points(d).update(correctness=float("nan"))),
                            "/stages/0/points/correctness: a finite number is needed"),
    "points above the maximum": (edited(lambda d: first_points(d).update(correctness=1000)),
                                 "/stages/0/points/correctness: 1000 is more than max_correctness"),
    "negative points": (edited(lambda d: first_points(d).update(penalty=-50)), "/stages/0/points/penalty"),
    "a student as a number": (edited(lambda d: d.update(student=5)), "/student: a string is needed, not 5"),
    "an empty student": (edited(lambda d: d.update(student=" ")), "/student: the student's id is empty"),
    "no device": (edited(lambda d: d.update(device=None)), "/device: an object is needed, not null"),
    "an unknown backend": (edited(lambda d: d["device"].update(backend="tpu")), "/device/backend"),
    "a message as a number": (edited(lambda d: d["stages"][0].update(message=5)), "/stages/0/message"),
    "a rubric line as a number": (edited(lambda d: first_points(d).update(lines=[1])), "/stages/0/points/lines/0"),
    "a zero time": (edited(lambda d: d["stages"][0]["performance"]["timings"][1].update(median_ms=0)),
                    "/stages/0/performance/timings/1/median_ms"),
    "a huge seed": (edited(lambda d: d.update(seed=10**30)), "/seed: 100000000000... is out of range"),
    "a 5000-digit number": ('{"seed": ' + "9" * 5000 + ', "stages": []}', "cannot read it as JSON"),
    "nesting 100000 deep": ('{"stages": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "a key twice": ('{"stages": [], "stages": []}', "the key 'stages' appears twice"),
}


@pytest.mark.parametrize("name", EDITS)
def test_an_edited_file_is_refused_with_the_file_and_the_key(tmp_path: Path, name: str) -> None:
    text, message = EDITS[name]
    folder = write_results(tmp_path, make_class())
    (folder / "ada.json").write_text(text)
    with pytest.raises(ResultsError) as raised:
        load_results(folder)
    assert str(raised.value).startswith(f"{folder / 'ada.json'}: ")
    assert message in str(raised.value)


def test_what_the_grader_writes_as_nan_or_infinity_is_read(tmp_path: Path) -> None:
    # A timing of one sample has an infinite spread, and a kernel's output may be NaN: data, not damage. Points
    # must be finite (above).
    def unbounded(data: dict[str, Any]) -> None:
        data["stages"][0]["performance"]["timings"][1]["rse"] = float("inf")
        data["stages"][0]["cases"][0]["got"] = float("nan")

    folder = write_results(tmp_path, make_class())
    (folder / "ada.json").write_text(edited(unbounded))
    ada = next(r for r in load_results(folder) if r.student == "ada")
    assert ada.stages[0].performance.timings[1].rse == float("inf")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_reports_a_bad_file_as_a_configuration_error(tmp_path: Path, command: str) -> None:
    folder = write_results(tmp_path / "results", make_class())
    for text, message in (EDITS["a stage twice"], EDITS["no device"], EDITS["nesting 100000 deep"]):
        (folder / "ada.json").write_text(text)
        outcome = CliRunner().invoke(cli, [command, str(folder)])
        assert outcome.exit_code == 1 and isinstance(outcome.exception, SystemExit), outcome.output
        assert f"Error: {folder / 'ada.json'}: " in outcome.output and message in outcome.output


def loads_within(folder: Path, seconds: float) -> BaseException | None:
    """What load_results(folder) raised, from a thread that must finish within `seconds`."""
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_results(folder)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=load, daemon=True)  # a blocked open() cannot be stopped: the thread is left
    thread.start()
    thread.join(seconds)
    assert outcome, f"reading {folder} blocked"
    return outcome[0]


@pytest.mark.parametrize(("make", "reason"), [
    (os.mkfifo, "a FIFO, not a regular file"),
    (os.mkdir, "a folder, not a regular file"),
    (lambda path: os.symlink("/dev/zero", path), "a symbolic link, which is not followed"),
    (lambda path: os.symlink("nowhere", path), "a symbolic link, which is not followed"),
])
def test_only_regular_files_are_read_and_nothing_blocks(tmp_path: Path, make: Callable[[Path], None],
                                                        reason: str) -> None:
    folder = write_results(tmp_path, make_class())
    make(folder / "x.json")
    error = loads_within(folder, 10)
    assert isinstance(error, ResultsError) and f"{folder / 'x.json'}: cannot read it ({reason})" in str(error)


def test_a_file_too_large_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_results(tmp_path, make_class())
    monkeypatch.setattr(results_module, "MAX_RESULT_BYTES", 1024)
    with pytest.raises(ResultsError, match="ada.json: cannot read it \\(larger than"):
        load_results(folder)


@pytest.mark.parametrize("command", ["leaderboard", "feedback"])
def test_a_salt_file_that_is_a_folder_is_a_clear_error(tmp_path: Path, command: str) -> None:
    folder = write_results(tmp_path / "results", make_class())
    (folder / SALT_FILE).mkdir()
    outcome = CliRunner().invoke(cli, [command, str(folder)])
    assert outcome.exit_code == 1 and isinstance(outcome.exception, SystemExit), outcome.output
    assert f"{folder / SALT_FILE}: the pseudonym salt file is not a regular file" in outcome.output


@pytest.mark.parametrize(("command", "default"), [("leaderboard", "leaderboard"), ("feedback", "feedback"),
                                                  ("export", "exports")])
def test_a_file_where_the_output_folder_goes_is_a_clear_error(tmp_path: Path, command: str, default: str) -> None:
    folder = write_results(tmp_path / "results", make_class())
    (folder / default).write_text("in the way")
    outcome = CliRunner().invoke(cli, [command, str(folder), "--salt", "s"] if command != "export"
                                 else [command, str(folder)])
    assert outcome.exit_code == 1 and isinstance(outcome.exception, SystemExit), outcome.output
    assert f"Error: cannot write {folder / default}/" in outcome.output
    assert f"({folder / default} is not a folder)" in outcome.output
    under = CliRunner().invoke(cli, [command, str(folder), "--out", str(folder / default / "sub")])
    assert under.exit_code == 2 and f"{folder / default} is not a folder" in under.output
