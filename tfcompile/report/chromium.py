"""Render a report in headless Chromium: the DOM after load, the page's console messages, and a
screenshot. Used by tests/report (the page must render with no console message) and by
scripts/report_screenshot.py (docs/report.png). Debian: `apt-get install chromium`.

Console messages are read from Chromium's own log (`--enable-logging=stderr --v=0`), where each
one is a line `...:INFO:CONSOLE:<line>] "<message>", source: <url> (<line>)`; a blocked fetch
(the page's Content-Security-Policy forbids every one) is logged there too.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tfcompile.settings import settings

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0")


@dataclass(frozen=True)
class Rendered:
    dom: str  # document.documentElement.outerHTML after load (--dump-dom)
    console: list[str]  # the page's console messages, from Chromium's log
    log: str  # Chromium's whole stderr


def find() -> str | None:
    """$TFCOMPILE_CHROMIUM, else the first Chromium on PATH."""
    return settings().chromium or next(filter(None, map(shutil.which, CANDIDATES)), None)


def _run(page: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    exe = find()
    if exe is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium, or set TFCOMPILE_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="tfcompile-chromium-") as profile:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *extra, Path(page).absolute().as_uri()],
                              capture_output=True, text=True, timeout=timeout, check=False)


def render(page: Path) -> Rendered:
    res = _run(page, "--dump-dom")
    console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    if res.returncode != 0 or "<html" not in res.stdout:
        raise RuntimeError(f"chromium exited {res.returncode} without a DOM:\n{res.stderr[-2000:]}")
    return Rendered(res.stdout, console, res.stderr)


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 2400) -> Rendered:
    res = _run(page, f"--screenshot={Path(png).absolute()}", f"--window-size={width},{height}")
    if not Path(png).is_file():
        raise RuntimeError(f"chromium exited {res.returncode} without a screenshot:\n{res.stderr[-2000:]}")
    return Rendered("", [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln], res.stderr)
