"""The HTML pages in a real browser: headless Chromium, with every host name unresolvable, so a page that
needed the network would show it. The page's own script reports, as attributes of <body>, how many charts
drew with a non-zero size, how many table rows there are and whether anything was fetched; a screenshot
shows the charts' colour on screen.

Skipped only where no Chromium is installed (`apt-get install chromium`, or scripts/install-system-packages.sh).
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from publish_class import make_class, write_results

from autograder.publish import feedback, leaderboard

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here: apt-get install chromium")

CHART_BLUE = np.array([0x3B, 0x6F, 0xB6]) / 255.0  # the bars and dots of the charts (plots._YOURS)


def chromium(page: Path, profile: Path, *mode: str) -> str:
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: the page gets no network
        "--virtual-time-budget=5000",  # let the load event and the page's script run before the dump
        *mode, page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Rendered(HTMLParser):
    """What the dumped DOM says: <body>'s attributes and the rows of each table, by class."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.rows: dict[str, int] = {}
        self._tables: list[str] = []
        self._in_body_rows = False
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        if tag == "body":
            self.body = attributes
        elif tag == "table":
            self._tables.append(attributes.get("class", ""))
        elif tag == "tbody":
            self._in_body_rows = True
        elif tag == "tr" and self._in_body_rows and self._tables:
            self.rows[self._tables[-1]] = self.rows.get(self._tables[-1], 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body_rows = False
        elif tag == "table" and self._tables:
            self._tables.pop()


def render(page: Path, tmp_path: Path) -> Rendered:
    return Rendered(chromium(page, tmp_path / "profile", "--dump-dom"))


def screenshot(page: Path, tmp_path: Path) -> np.ndarray:
    shot = tmp_path / "shot.png"
    chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,5000")
    return image.imread(shot)[..., :3]


def chart_pixels(pixels: np.ndarray) -> int:
    return int((np.abs(pixels - CHART_BLUE).max(axis=-1) < 0.04).sum())


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("published")
    results = write_results(root / "results", make_class())
    leaderboard.main(results, root / "board", cub_gbps=4400.0)
    feedback.main(results, root / "feedback")
    return root


def test_the_leaderboard_renders_offline_with_its_table_and_charts(published: Path, tmp_path: Path) -> None:
    page = render(published / "board" / "leaderboard.html", tmp_path)
    assert page.body.get("data-rendered") == "yes"
    assert page.body["data-images"] == "3" and page.body["data-images-drawn"] == "3"
    assert page.body["data-fetched"] == "0"
    assert page.rows == {"board": 6, "open-board": 2}
    assert chart_pixels(screenshot(published / "board" / "leaderboard.html", tmp_path)) > 2000


def test_a_feedback_page_renders_its_tables_and_chart(published: Path, tmp_path: Path) -> None:
    page = render(published / "feedback" / "linus.html", tmp_path)
    assert page.body.get("data-rendered") == "yes"
    assert page.body["data-images"] == "1" and page.body["data-images-drawn"] == "1"
    assert page.body["data-fetched"] == "0"
    assert page.rows["stages"] == 7
    assert page.rows["failed-cases"] == 3 and page.rows["findings"] == 1
    assert chart_pixels(screenshot(published / "feedback" / "linus.html", tmp_path)) > 500


def test_a_cpu_feedback_page_renders_without_a_chart(published: Path, tmp_path: Path) -> None:
    page = render(published / "feedback" / "barbara.html", tmp_path)
    assert page.body.get("data-rendered") == "yes" and page.body["data-images"] == "0"
    assert page.rows["stages"] == 8  # barbara handed in the open stage too
    assert chart_pixels(screenshot(published / "feedback" / "barbara.html", tmp_path)) == 0


def test_a_page_that_needs_the_network_is_caught(published: Path, tmp_path: Path) -> None:
    """The check above can fail: the same page with one image from the web draws one image fewer."""
    html = (published / "board" / "leaderboard.html").read_text()
    broken = tmp_path / "broken.html"
    broken.write_text(html.replace("<h2>Charts</h2>", '<h2>Charts</h2><img src="https://example.com/logo.png" '
                                                      'alt="logo" width="50" height="50">'))
    page = render(broken, tmp_path)
    assert page.body["data-images"] == "4"
    assert page.body["data-images-drawn"] == "3"
