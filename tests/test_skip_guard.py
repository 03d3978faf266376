"""tests/skip_guard.py: a skipped CPU test fails the run; GPU-only skips (marker) do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALLOWED = ("import pytest\n"
           "@pytest.mark.gpu\ndef test_gpu():\n    pytest.skip('needs a CUDA GPU')\n"
           "@pytest.mark.cpu_only\ndef test_cpu_only():\n    pytest.skip('a GPU is present')\n"
           "@pytest.mark.xfail(strict=True, reason='known')\ndef test_xfail():\n    assert False\n"
           "def test_ok():\n    pass\n")
HOLE = "def test_hole():\n    pytest.skip('no nvcc here')\n"
MODULE = "import pytest\npytest.importorskip('no_such_module_for_the_guard')\ndef test_a():\n    pass\n"


def _run(tmp_path: Path, body: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_guarded.py").write_text(body)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: x\n    cpu_only: x\n")
    environ = {k: v for k, v in os.environ.items() if k != "TFCOMPILE_ALLOW_SKIPS"}
    environ.update(PYTHONPATH=str(TESTS), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **env)  # a fast start
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "skip_guard", "-p", "no:cacheprovider",
                           str(tmp_path), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=environ)


def test_gpu_only_skips_and_xfails_pass(tmp_path):
    res = _run(tmp_path, ALLOWED)
    assert res.returncode == 0 and "2 skipped" in res.stdout, res.stdout[-3000:]


def test_a_skipped_cpu_test_fails_the_run_under_xdist(tmp_path):
    res = _run(tmp_path, ALLOWED + HOLE, "-p", "xdist.plugin", "-n", "2")
    assert res.returncode == 1, res.stdout[-3000:]
    assert "skipped CPU tests (1): FAILED" in res.stdout and "hint: a CPU test may not be skipped" in res.stdout
    assert "SKIPPED test_guarded.py::test_hole: no nvcc here" in res.stdout and "test_gpu:" not in res.stdout


def test_a_module_skipped_at_import_fails_instead_of_exit_5(tmp_path):
    res = _run(tmp_path, MODULE)  # plain pytest would exit 5: no test collected
    assert res.returncode == 1 and "no_such_module_for_the_guard" in res.stdout, res.stdout[-3000:]


def test_a_local_run_may_allow_skips(tmp_path):
    res = _run(tmp_path, ALLOWED + HOLE, TFCOMPILE_ALLOW_SKIPS="1")
    assert res.returncode == 0 and "allowed by TFCOMPILE_ALLOW_SKIPS" in res.stdout
