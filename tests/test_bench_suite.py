"""The bench suite (bench/__main__.py, issue 25 item 6): one runner lists every script once, in a
group; no script moves sys.path (a bench runs as its own script, so bench/ is first on its path
already); and no bench's name is an installed package's, which it would shadow for every bench
that imports it by name (bench/kernels.py once broke every model load: transformers imports
Hugging Face's `kernels`)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _runner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def _suite() -> dict:
    code = ("import json, bench.__main__ as m; print(json.dumps({'suite': m.SUITE, 'scripts': m.scripts()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_script_is_listed_once_in_a_group():
    doc = _suite()
    assert sorted(doc["suite"]) == doc["scripts"]
    assert {g for g, _ in doc["suite"].values()} <= {"performance", "accuracy", "peers", "studies", "lib"}
    listed = _runner("list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(doc["scripts"])


def test_studies_live_in_studies():
    """Every study is in bench/studies/ and only a study is; the runner runs one as a module of the
    package, its helpers imported (bench.common, bench.heldout)."""
    doc = _suite()
    studies = {n for n, (g, _) in doc["suite"].items() if g == "studies"}
    inside = {p.stem for p in (BENCH / "studies").glob("*.py") if not p.stem.startswith("__")}
    assert inside and inside == studies
    assert not any((BENCH / f"{n}.py").is_file() for n in studies)
    for name, flag in (("acc_rotation", "--write-docs"), ("fp8_rounding", "--llmc-python"), ("draft_probe", "--draft")):
        ok = _runner("run", name, "--help")
        assert ok.returncode == 0 and "usage:" in ok.stdout and flag in ok.stdout, (name, ok.stderr)


def test_the_runner_runs_a_bench_and_refuses_what_is_not_one():
    ok = _runner("run", "formats", "--help")
    assert ok.returncode == 0 and "usage: formats.py" in ok.stdout
    for args in (("run", "no_such_bench"), ("run", "common"), ("frobnicate",)):
        bad = _runner(*args)
        assert bad.returncode == 2 and "hint:" in bad.stderr, args


def test_no_bench_moves_sys_path():
    bad = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                else node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and target.attr == "path" and \
                    isinstance(target.value, ast.Name) and target.value.id == "sys":
                bad.append(f"{path.name}:{node.lineno}")
    assert bad == []


def test_no_bench_name_is_an_installed_package():
    names = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("__"))
    # isolated (-I): neither the current directory nor PYTHONPATH, only what is installed
    code = f"import importlib.util, json; print(json.dumps([n for n in {names!r} if importlib.util.find_spec(n)]))"
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
