"""The Debian packages the tests read (.ci/apt-packages), checked once at the start of a run.

A missing one stops the run before collection with one line per package, naming it and the
command that installs it (`bash scripts/test.sh` installs them itself where it runs as root),
instead of dozens of failures deep in the run. TFCOMPILE_ALLOW_SKIPS=1 (a local run that lacks
them on purpose) turns the stop into a warning, as for skipped tests (tests/skip_guard.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LIST = Path(__file__).resolve().parents[1] / ".ci" / "apt-packages"
ALLOW_ENV = "TFCOMPILE_ALLOW_SKIPS"


def packages(path: Path = LIST) -> list[str]:
    """Package names of .ci/apt-packages, in file order (comments and blank lines dropped)."""
    names = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [n for n in names if n]


def _dpkg_installed(name: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return False
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout


def _python_doc() -> bool:  # honours TFCOMPILE_PYTHON_DOC (the sources unpacked off Debian)
    from tfcompile.calibration.corpus import PYTHON_DOC_DIR

    return Path(PYTHON_DOC_DIR).is_dir()


def _chromium() -> bool:  # honours TFCOMPILE_CHROMIUM
    from tfcompile.report import chromium

    return chromium.find() is not None


# What the tests really read of a package, where that can be found elsewhere than through dpkg.
PRESENT = {"python3.11-doc": _python_doc, "chromium": _chromium}


def missing(names: list[str] | None = None) -> list[str]:
    return [n for n in (packages() if names is None else names)
            if not PRESENT.get(n, lambda n=n: _dpkg_installed(n))()]


def message(absent: list[str]) -> str:
    return "\n".join(f"error: the Debian package {n} is missing, and the tests read it (.ci/apt-packages)"
                     for n in absent) + (f"\nhint: apt-get update && apt-get install {' '.join(absent)}"
                                         f" (or run the README's test command, bash scripts/test.sh, as root)")


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # xdist workers: the controller has checked
        return
    absent = missing()
    if not absent:
        return
    if os.environ.get(ALLOW_ENV, "") not in ("", "0"):
        config.issue_config_time_warning(pytest.PytestWarning(message(absent).replace("error:", "warning:")),
                                         stacklevel=2)
        return
    pytest.exit(message(absent), returncode=pytest.ExitCode.USAGE_ERROR)
