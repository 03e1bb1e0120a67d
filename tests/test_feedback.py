"""Feedback pages: the stage table, failed sizes with the hint, findings with the line, the chart, the points."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner
from markdown_view import elements, shown_text
from publish_class import make_class, write_results

from autograder.cli import cli
from autograder.publish import feedback
from autograder.publish.pseudonyms import SALT_FILE, pseudonym
from autograder.publish.render import markdown_text
from autograder.records import KernelMetrics, LineMetric, StudentResult


def student(name: str):
    return next(r for r in make_class() if r.student == name)


def test_the_stage_table_compares_with_the_reference() -> None:
    page = feedback.build_page(student("linus"))
    table = page.stage_table
    assert [row[0] for row in table.rows] == ["1. Naive", "2. Anti-divergence", "3. Sequential addressing",
                                              "4. First add during load", "5. Unrolled last warp", "6. Warp shuffle",
                                              "7. 2-D max by quadrants"]  # no open stage: linus handed none in
    naive = dict(zip(table.columns, table.rows[0], strict=True))
    assert naive["Your time (ms)"] == "0.7139" and naive["Reference (ms)"] == "0.6490"
    assert naive["Yours / reference (allowed)"] == "1.10 (1.25)"
    assert naive["Points"] == "10 / 10"
    anti = dict(zip(table.columns, table.rows[1], strict=True))
    assert anti["Speedup (required)"] == "1.59x (1.40x)"
    max2d = dict(zip(table.columns, table.rows[6], strict=True))
    assert max2d["Status"] == "incorrect" and max2d["Points"] == "0 / 15"
    assert page.chart is not None


def test_failed_sizes_findings_and_points_are_spelled_out(tmp_path: Path) -> None:
    result = student("linus")
    written = feedback.write_feedback(feedback.build_page(result), tmp_path)
    assert {p.name for p in written} == {"linus.md", "linus.html", "linus-speedups.svg"}
    for page in ("linus.md", "linus.html"):
        text = (tmp_path / page).read_text()
        text = shown_text(text) if page.endswith(".md") else text  # what a Markdown viewer shows
        assert "257x3 random" in text and "65535x3 random" in text and "n=257" not in text  # only failed cases
        assert "clamp the index instead of skipping it" in text  # the hint
        assert "race syncwarp" in text and "lanes 0 and 16 touch sdata[16]" in text
        unrolled = next(s for s in result.stages if s.stage == "unrolled_warp")
        for line in unrolled.points.lines:  # the rubric, line by line
            assert line in text
        assert "penalty -5: race_syncwarp" in text
        assert "Score: 80 of 100 points." in text.replace("<strong>", "").replace("</strong>", "")
    markdown = (tmp_path / "linus.md").read_text()
    assert "| race syncwarp | 14 |" in markdown  # the cell line of the finding
    assert "![" in markdown and "(linus-speedups.svg)" in markdown
    assert (tmp_path / "linus-speedups.svg").read_text().startswith("<?xml")


def test_compile_errors_show_the_cell_line(tmp_path: Path) -> None:
    feedback.write_feedback(feedback.build_page(student("grace")), tmp_path)
    markdown = (tmp_path / "grace.md").read_text()
    assert "## 5. Unrolled last warp (unrolled_warp): compile error" in markdown
    assert '| error | 12 | expected a ";" |' in markdown


def test_cpu_results_say_not_measured_and_have_no_chart(tmp_path: Path) -> None:
    page = feedback.build_page(student("barbara"))
    assert page.chart is None
    written = feedback.write_feedback(page, tmp_path)
    assert {p.name for p in written} == {"barbara.md", "barbara.html"}
    markdown = (tmp_path / "barbara.md").read_text()
    assert "| 1. Naive | correct | not measured |" in markdown
    assert "no speedup chart" in markdown
    assert "Speed: not measured (the CPU backend does not time kernels)." in markdown
    assert "data:image" not in (tmp_path / "barbara.html").read_text()


def test_the_seed_stays_with_the_staff(tmp_path: Path) -> None:
    result = dataclasses.replace(student("ada"), seed=987654321)
    feedback.write_feedback(feedback.build_page(result), tmp_path)
    assert "987654321" not in (tmp_path / "ada.md").read_text() + (tmp_path / "ada.html").read_text()


def test_the_page_names_the_leaderboard_pseudonym_when_the_salt_is_known(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    feedback.main(results, tmp_path / "plain")
    assert "leaderboard" not in (tmp_path / "plain" / "ada.md").read_text()
    (results / SALT_FILE).write_text("kept-salt\n")
    feedback.main(results, tmp_path / "named")
    assert f"**{pseudonym('ada', 'kept-salt')}**" in (tmp_path / "named" / "ada.md").read_text()


def test_odd_student_ids_make_safe_distinct_file_names() -> None:
    assert feedback.file_stem("Ada Lovelace/../x@uni").startswith("Ada_Lovelace_.._x_uni-")
    assert feedback.file_stem("..").startswith("student-")
    assert feedback.file_stems(["a b", "a_b"]) == {"a b": feedback.file_stem("a b"), "a_b": "a_b"}
    assert feedback.file_stem("a b") != "a_b"


def test_the_feedback_command(tmp_path: Path) -> None:
    results = write_results(tmp_path / "results", make_class())
    runner = CliRunner()
    outcome = runner.invoke(cli, ["feedback", str(results), "--out", str(tmp_path / "fb"), "--student", "ken"])
    assert outcome.exit_code == 0, outcome.output
    assert sorted(p.name for p in (tmp_path / "fb").iterdir()) == ["ken.html", "ken.md"]
    default = runner.invoke(cli, ["feedback", str(results)])
    assert default.exit_code == 0 and (results / "feedback" / "ada.html").exists()
    unknown = runner.invoke(cli, ["feedback", str(results), "--student", "nobody"])
    assert unknown.exit_code == 1 and "no results for nobody" in unknown.output


# Student-controlled text that a Markdown viewer allowing HTML would run or turn into a link, if copied raw.
HOSTILE = ("<img src=x onerror=alert(1)>", "<script>alert(3)</script>", "[x](javascript:alert(2))",
           "</code></pre>", "![i](x.png) *em* _em_ # head | cell ~~gone~~ `tick` & \\")


def hostile_twin(result: StudentResult, text: str) -> StudentResult:
    """`result` with `text` in every piece of text the student controls: the id, the notebook's name, the
    compiler's messages, the findings and the kernel's lines, and the messages that quote them."""
    stages = []
    for stage in result.stages:
        compiler = tuple(dataclasses.replace(m, text=f"static assertion failed: {text}") for m in stage.compiler)
        findings = tuple(dataclasses.replace(f, message=f"{f.message} {text}", kernel=text) for f in stage.findings)
        stages.append(dataclasses.replace(stage, message=f"{stage.message} {text}", compiler=compiler,
                                          findings=findings, hint=stage.hint and f"{stage.hint} {text}"))
    return dataclasses.replace(result, student=text, notebook=f"{text}.ipynb", stages=tuple(stages),
                               problems=(f"a cell is duplicated: {text}",))


def test_the_rule_for_student_text_in_markdown() -> None:
    text = "jane_doe ran __syncthreads() in a*b [x](y) <b> & | # ~ \\ `z`\n\n# not a heading"
    assert markdown_text(text) == ("jane_doe ran \\_\\_syncthreads() in a\\*b \\[x\\](y) &lt;b&gt; &amp; \\| \\# \\~ "
                                   "\\\\ \\`z\\` \\# not a heading")


@pytest.mark.parametrize("payload", HOSTILE)
def test_student_text_in_the_markdown_page_is_inert(tmp_path: Path, payload: str) -> None:
    plain, hostile = tmp_path / "plain", tmp_path / "hostile"
    for name in ("grace", "linus"):  # a compile error, and a race finding with the kernel's name
        result = student(name)
        feedback.write_feedback(feedback.build_page(hostile_twin(result, "x")), plain, name)
        feedback.write_feedback(feedback.build_page(hostile_twin(result, payload)), hostile, name)
        markdown = (hostile / f"{name}.md").read_text()
        # The page has the very elements of the same page without the payload: no image, script, link or
        # emphasis came from the student's text, which shows as written (the notebook line is a code span).
        assert elements(markdown) == elements((plain / f"{name}.md").read_text())
        shown = shown_text(markdown)
        assert shown.count(payload) >= 4, shown  # the title, the messages and their tables
        assert f"Feedback: {payload}" in shown


def test_ordinary_text_and_kernel_lines_read_as_written(tmp_path: Path) -> None:
    line = LineMetric(19, "sdata[tid] += sdata[tid + s]; // a_b && c < d", 32, 96)
    metrics = KernelMetrics((line,), 0.08, blocks=4)
    result = student("barbara")
    stages = (dataclasses.replace(result.stages[0], metrics=metrics), *result.stages[1:])
    feedback.write_feedback(feedback.build_page(dataclasses.replace(result, stages=stages)), tmp_path)
    markdown = (tmp_path / "barbara.md").read_text()
    assert "sdata\\[tid\\] += sdata\\[tid + s\\]; // a_b &amp;&amp; c &lt; d" in markdown
    assert "(sdata[tid] += sdata[tid + s]; // a_b && c < d): bank conflicts" in shown_text(markdown)
    assert "Speed: not measured (the CPU backend does not time kernels)." in markdown  # no escapes needed
