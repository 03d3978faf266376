"""Lint: ruff's pyflakes rules (pyproject `[tool.ruff.lint]`) pass over the whole tree.

An undefined name is a crash waiting on the path that reaches it; an unused import or local is
dead code or a forgotten use. The import direction is checked by tests/test_import_contract.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_pyflakes_rules_pass_on_the_tree():
    r = _ruff(".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_lint_finds_what_it_should(tmp_path):
    """The configured rules do catch an undefined name and an unused import (not a vacuous run)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return World\n")
    r = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout, r.stdout + r.stderr
