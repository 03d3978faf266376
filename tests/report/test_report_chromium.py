"""The report in a real browser: Debian's headless Chromium renders it, the plots are in the DOM
with their marks, nothing is logged on the page's console, and a screenshot is produced.

Not skipped without Chromium: it fails with the install line (CI installs it, `.ci/run`)."""

from __future__ import annotations

import re

import pytest

from tfcompile.report import chromium

BAD_PAGES = {  # the console check must catch what a broken report would do
    "script error": "<script>undefinedFunction()</script>",
    "blocked fetch": '<img src="https://example.com/x.png">',
}


@pytest.fixture(scope="module")
def browser():
    exe = chromium.find()
    assert exe, "Chromium is needed for the report tests: apt-get install chromium (or set TFCOMPILE_CHROMIUM)"
    return exe


def test_report_renders_with_its_plots_and_no_console_message(browser, reported):
    out, _ = reported
    page = chromium.render(out / "tfcompile" / "report.html")
    assert page.console == [], page.console
    dom = page.dom
    for fig in ("weight-sqnr", "eval-sqnr", "layer-kl"):
        assert re.search(rf'<figure id="{fig}">.*?<svg class="chart', dom, re.S), fig
    assert len(re.findall(r'<rect class="bar"', dom)) == 14
    assert len(re.findall(r'<circle class="point"', dom)) == 2 * 14 + 2
    assert 'class="pass"' in dom and "sm_100a" in dom


def test_screenshot(browser, reported, tmp_path):
    out, _ = reported
    png = tmp_path / "report.png"
    shot = chromium.screenshot(out / "tfcompile" / "report.html", png, 1000, 1400)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000  # a drawn page, not a blank one
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1000, 1400)
    assert shot.console == []


@pytest.mark.parametrize("what", list(BAD_PAGES))
def test_the_console_check_catches_a_broken_page(what, browser, reported, tmp_path):
    out, _ = reported
    html = (out / "tfcompile" / "report.html").read_text().replace("</main>", BAD_PAGES[what] + "</main>")
    page = tmp_path / "bad.html"
    page.write_text(html)
    assert chromium.render(page).console, f"{what}: not seen on the console"
