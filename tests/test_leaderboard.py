"""The class leaderboard: ranking, columns, the open stage against CUB, pseudonyms, the files and the command."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from markdown_view import elements, shown_text
from publish_class import H200, STUDENTS, gpu_stage, gpu_student, make_class, write_results

from autograder.calibration import Calibration, StageCalibration, write_calibration
from autograder.cli import cli
from autograder.publish import leaderboard
from autograder.publish.figures import Ceilings, best_verified, load_ceilings
from autograder.publish.pseudonyms import SALT_FILE, PseudonymError, pseudonym, pseudonyms
from autograder.publish.results import ResultsError, load_results
from autograder.records import Finding, to_dict
from autograder.stages import STAGES

NO_CEILINGS = Ceilings({}, {})


def board_of(results, ceilings: Ceilings = NO_CEILINGS) -> leaderboard.Leaderboard:
    return leaderboard.build_leaderboard(results, {r.student: r.student for r in results}, ceilings)


def test_ranked_by_score_then_by_the_fastest_verified_kernel() -> None:
    board = board_of(make_class()).board
    # ada and dennis both have full marks; ada's open-stage kernel is faster, so she is first.
    assert list(board["name"]) == ["ada", "dennis", "grace", "linus", "barbara", "ken"]
    assert list(board["rank"]) == [1, 2, 3, 4, 5, 6]
    assert board.loc[0, "total"] == board.loc[1, "total"] == 100
    assert board.loc[0, "best_stage"] == "open" and board.loc[0, "best_gbps"] > board.loc[1, "best_gbps"]


def test_results_without_timings_tie_on_speed_and_share_a_rank() -> None:
    results = make_class()
    barbara = next(r for r in results if r.student == "barbara")
    twin = dataclasses.replace(barbara, student="barbara2")
    board = board_of([*results, twin]).board
    rows = board[board["name"].isin(["barbara", "barbara2"])]
    assert list(rows["rank"]) == [5, 5]
    assert list(board["rank"]) == [1, 2, 3, 4, 5, 5, 7]  # competition ranking: the next rank skips
    assert rows["best_gbps"].isna().all()


def test_a_racy_kernel_is_never_the_fastest_verified() -> None:
    race = Finding("race_syncwarp", "lanes 0 and 16 race", 9)
    factors = {s.id: 1.0 for s in STAGES if not s.optional}
    result = gpu_student("eve", factors, {"shuffle": gpu_stage("shuffle", 1.0, 0.134, findings=(race,))})
    best = best_verified(result)
    assert best is not None and best.stage.id == "unrolled_warp"
    row = board_of([result]).board.iloc[0]
    assert row["best_stage"] == "unrolled_warp"
    # The racy stage's time is still shown in its own columns: it is measured, only not verified.
    assert row["shuffle_ms"] == pytest.approx(0.128)


def test_each_stage_has_time_bandwidth_and_speedup_columns() -> None:
    board = board_of(make_class()).board.set_index("name")
    for stage in leaderboard.RANKED_STAGES:
        for suffix in ("status", "ms", "gbps", "speedup"):
            assert f"{stage.id}_{suffix}" in board.columns
    assert "open_ms" not in board.columns  # the open stage has its own table
    assert board.loc["ada", "naive_ms"] == pytest.approx(0.649)
    assert board.loc["ada", "naive_gbps"] == pytest.approx(4 * 2**26 / 0.649e6)
    assert board.loc["ada", "anti_divergence_speedup"] == pytest.approx(0.649 / 0.408)
    assert math.isnan(board.loc["ada", "naive_speedup"])  # the first stage has no previous stage
    assert board.loc["grace", "unrolled_warp_status"] == "compile error"
    assert math.isnan(board.loc["grace", "unrolled_warp_ms"])
    assert board.loc["linus", "max2d_status"] == "incorrect"
    assert board.loc["barbara", "naive_status"] == "not measured"
    assert math.isnan(board.loc["barbara", "naive_ms"])
    assert board.loc["ken", "first_add_status"] == "not attempted"


def test_open_stage_is_ranked_by_its_fraction_of_cub() -> None:
    ceilings = load_ceilings(cub_gbps=4400.0, devices=[H200.name])
    board = board_of(make_class(), ceilings)
    assert board.open_basis == leaderboard.BY_CUB
    open_board = board.open_board
    assert list(open_board["name"]) == ["ada", "dennis"]  # only verified, measured open kernels
    assert open_board.loc[0, "cub_fraction"] == pytest.approx(open_board.loc[0, "gbps"] / 4400.0)
    assert open_board.loc[0, "peak_fraction"] == pytest.approx(open_board.loc[0, "gbps"] / 4800.0)
    assert not any("CUB" in note for note in board.notes)


def test_without_a_cub_figure_the_open_stage_is_ranked_by_gbps_and_says_so() -> None:
    board = board_of(make_class())
    assert board.open_basis == leaderboard.BY_GBPS
    assert math.isnan(board.open_board.loc[0, "cub_fraction"])
    assert any("no CUB" in note and H200.name in note for note in board.notes)
    assert any("ranked by score only" in note for note in board.notes)  # the CPU-backend results


def test_the_cub_figure_comes_from_the_gpu_calibration(tmp_path: Path) -> None:
    calibration = Calibration(H200.name, "2026-11-21T00:00:00Z", 256, 1 << 26, (8192, 8192), {},
                              {"naive": StageCalibration(0.649, 413.6, None)}, cub_gbps=4400.0)
    path = write_calibration(calibration, tmp_path / "nvidia-h200.json")
    ceilings = load_ceilings([path], devices=[H200.name])
    assert ceilings.cub_for(H200.name) == 4400.0
    assert ceilings.peak_for(H200.name) == 4800.0  # the datasheet figure of PRODUCT.md
    assert ceilings.cub_for("NVIDIA A100-SXM4-80GB") is None
    assert board_of(make_class(), ceilings).open_basis == leaderboard.BY_CUB


def test_pseudonyms_are_stable_salted_and_distinct() -> None:
    assert pseudonym("ada", "salt-1") == pseudonym("ada", "salt-1")
    assert pseudonym("ada", "salt-1") != pseudonym("ada", "salt-2")
    assert re.fullmatch(r"[a-z]+-[a-z]+-[0-9a-f]{4}", pseudonym("ada", "salt-1"))
    names = pseudonyms(STUDENTS, "salt-1")
    assert len(set(names.values())) == len(STUDENTS)


def test_a_pseudonym_clash_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autograder.publish.pseudonyms.pseudonym", lambda student, salt: "same-name-0000")
    with pytest.raises(PseudonymError, match="share the pseudonym"):
        pseudonyms(["ada", "ken"], "salt")


def renamed_class() -> list:
    """The class under ids that cannot occur in a page by chance, to look for leaks."""
    return [dataclasses.replace(r, student=f"Realname{r.student.title()}Xyz",
                                notebook=f"submissions/Realname{r.student.title()}Xyz/reduction.ipynb")
            for r in make_class()]


def published_text(folder: Path) -> str:
    """Everything written under `folder` that a reader sees, charts decoded."""
    import base64

    texts = []
    for path in folder.rglob("*"):
        if path.is_file() and path.name != SALT_FILE:
            text = path.read_text(encoding="utf-8")
            for encoded in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", text):
                texts.append(base64.b64decode(encoded).decode("utf-8"))
            texts.append(text)
    return "\n".join(texts)


def test_pseudonymous_pages_never_show_a_real_name(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", renamed_class())
    written = leaderboard.main(results, tmp_path / "board", cub_gbps=4400.0)
    assert {p.name for p in written} == {"leaderboard.csv", "leaderboard-open.csv", "leaderboard.md",
                                         "leaderboard.html"}
    text = published_text(tmp_path / "board")
    assert "Realname" not in text
    salt = (results / SALT_FILE).read_text().strip()
    board = pd.read_csv(tmp_path / "board" / "leaderboard.csv")
    assert pseudonym("RealnameAdaXyz", salt) == board.loc[0, "name"]
    # A second run keeps the salt file, so the names stay the same.
    leaderboard.main(results, tmp_path / "again")
    assert list(pd.read_csv(tmp_path / "again" / "leaderboard.csv")["name"]) == list(board["name"])


def test_real_names_when_asked_and_the_salt_given(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    leaderboard.main(results, tmp_path / "real", use_pseudonyms=False)
    assert list(pd.read_csv(tmp_path / "real" / "leaderboard.csv")["name"])[:2] == ["ada", "dennis"]
    assert not (results / SALT_FILE).exists()  # no salt is made when no pseudonyms are
    leaderboard.main(results, tmp_path / "salted", salt="course-secret")
    names = list(pd.read_csv(tmp_path / "salted" / "leaderboard.csv")["name"])
    assert names[0] == pseudonym("ada", "course-secret")


def test_the_files_hold_the_table_and_the_charts(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    leaderboard.main(results, tmp_path / "out", use_pseudonyms=False, cub_gbps=4400.0)
    csv = pd.read_csv(tmp_path / "out" / "leaderboard.csv")
    assert len(csv) == 6 and list(csv.columns[:8]) == ["rank", "name", "device", "total", "max_total",
                                                         "best_stage", "best_ms", "best_gbps"]
    markdown = (tmp_path / "out" / "leaderboard.md").read_text()
    board_lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert board_lines[0].startswith("| Rank | Name | Score |")
    assert sum(1 for line in board_lines if re.match(r"\| \d+ \| \w+ \|", line)) == 6 + 2  # board + open board
    assert "| 1 | ada | 100 / 100 |" in markdown
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    assert html.count("data:image/svg+xml;base64,") == 3  # scores, speedups, bandwidth
    assert re.search(r"(src|href)=\"(https?:)?//", html) is None
    assert "Content-Security-Policy" in html


def test_a_class_graded_on_the_cpu_has_only_the_score_chart(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", [r for r in make_class() if r.device.backend == "cpu"])
    leaderboard.main(results, tmp_path / "out", use_pseudonyms=False)
    html = (tmp_path / "out" / "leaderboard.html").read_text()
    assert html.count("data:image/svg+xml;base64,") == 1
    assert "not measured" in html and "No verified, measured open-stage kernels" in html


def test_the_reader_is_strict(tmp_path: Path) -> None:
    folder = write_results(tmp_path / "results", make_class()[:2])
    (folder / "summary.json").write_text(json.dumps({"students": 2}))  # not a result: left alone
    assert [r.student for r in load_results(folder)] == ["ada", "barbara"]
    data = to_dict(make_class()[0])
    data["stages"][0]["cases"][0]["got"] = math.nan  # a kernel that summed garbage: data, not drift
    (folder / "ada.json").write_text(json.dumps(data))
    assert math.isnan(load_results(folder)[0].stages[0].cases[0].got)
    data["stages"][0]["performance"]["timings"][0]["gflops"] = 1.0
    (folder / "ada.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="gflops"):
        load_results(folder)
    del data["stages"][0]["performance"]["timings"][0]["gflops"]
    del data["stages"][0]["hint"]
    (folder / "ada.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="hint"):
        load_results(folder)
    data["stages"][0]["hint"] = None
    data["stages"][0]["status"] = "mostly_correct"
    (folder / "ada.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="ada.json"):
        load_results(folder)
    with pytest.raises(ResultsError, match="no student result files"):
        load_results(tmp_path)


def test_the_leaderboard_command(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    runner = CliRunner()
    outcome = runner.invoke(cli, ["leaderboard", str(results), "--out", str(tmp_path / "out"), "--salt", "s3cret",
                                  "--cub-gbps", "4400", "--top", "3"])
    assert outcome.exit_code == 0, outcome.output
    assert str(tmp_path / "out" / "leaderboard.html") in outcome.output
    assert pseudonym("ada", "s3cret") in (tmp_path / "out" / "leaderboard.md").read_text()
    open_board = pd.read_csv(tmp_path / "out" / "leaderboard-open.csv")
    assert open_board.loc[0, "cub_gbps"] == 4400
    failed = runner.invoke(cli, ["leaderboard", str(tmp_path / "out")])
    assert failed.exit_code == 1 and "no student result files" in failed.output


@pytest.mark.parametrize("payload", ["<img src=x onerror=alert(1)>", "<script>alert(3)</script>",
                                     "[x](javascript:alert(2))", "*em* _em_ ~~s~~ `t` # h | ![i](x.png)"])
def test_real_names_in_the_markdown_board_are_inert(tmp_path: Path, payload: str) -> None:
    def board_of_names(name: str, out: Path) -> str:
        folder = tmp_path / f"{out.name}-results"
        folder.mkdir()
        for result in make_class():  # named by the grader's file stem: a payload may hold a slash
            data = to_dict(dataclasses.replace(result, student=f"{name} {result.student}"))
            (folder / f"{result.student}.json").write_text(json.dumps(data))
        leaderboard.main(folder, out, use_pseudonyms=False, cub_gbps=4400.0)
        return (out / "leaderboard.md").read_text()

    markdown = board_of_names(payload, tmp_path / "hostile")
    assert elements(markdown) == elements(board_of_names("x", tmp_path / "plain"))
    assert f"{payload} ada" in shown_text(markdown)  # in the board and in the open stage's board
    assert shown_text(markdown).count(payload) == 6 + 2
