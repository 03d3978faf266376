"""No silent holes: a test that should run on this CPU machine must not be skipped.

Every skip (a test's, or a whole module's at collection, e.g. a failed importorskip) fails the
run (exit 1) unless the test carries one of the ALLOWED markers: `gpu` (needs a CUDA GPU, which
CI machines do not have) or `cpu_only` (checks behaviour that only exists without a GPU, skipped
on a GPU machine). The list of offending skips and their reasons ends the terminal summary.

Works under pytest-xdist: skip reports reach the controller, which decides. For a local run on a
machine that lacks part of the toolchain (nvcc, Chromium), TFCOMPILE_ALLOW_SKIPS=1 turns the
failure into a warning; CI (.ci/run) never sets it.
"""

from __future__ import annotations

import os

import pytest

ALLOWED = ("gpu", "cpu_only")
ENV = "TFCOMPILE_ALLOW_SKIPS"
_skipped: list[tuple[str, str]] = []  # (node id, reason) of skips no marker allows


def _reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:  # (file, line, "Skipped: reason")
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr)


def _allowed(report) -> bool:
    return any(m in getattr(report, "keywords", {}) for m in ALLOWED)


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail") and not _allowed(report):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_collectreport(report):
    if report.skipped:  # a module skipped at import (importorskip, module-level pytest.skip)
        _skipped.append((report.nodeid or "<collection>", _reason(report)))


def _enforcing(config) -> bool:
    return not hasattr(config, "workerinput") and os.environ.get(ENV, "") in ("", "0")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _skipped or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    verdict = "FAILED" if _enforcing(config) else f"allowed by {ENV}"
    tr.section(f"skipped CPU tests ({len(_skipped)}): {verdict}", sep="=", red=_enforcing(config), bold=True)
    for nodeid, reason in sorted(set(_skipped)):
        tr.line(f"SKIPPED {nodeid}: {reason}")
    tr.line(f"hint: a CPU test may not be skipped (only tests marked {' or '.join(ALLOWED)}); install what the "
            f"reason names (pip install -e '.[test]', apt-get install python3.11-doc chromium, nvcc), or set "
            f"{ENV}=1 for a local run")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    # NO_TESTS_COLLECTED (5) too: every module skipped at import is a hole, not "nothing to run"
    if _skipped and _enforcing(session.config) and exitstatus in (pytest.ExitCode.OK,
                                                                   pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
