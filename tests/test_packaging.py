"""The wheel installs one distribution under the `tfcompile` name only."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_has_no_generic_top_level_packages(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("tfcompile-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tfcompile", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for sub in ("passes", "kernels", "calibration"):
        assert f"tfcompile/{sub}/__init__.py" in names, sub
    assert "tfcompile/kernels/formats/__init__.py" in names
    assert "tfcompile/passes/quantize/rtn.py" in names
    # every module of the source tree ships (an explicit package list forgets new ones silently)
    mapping = {"tfcompile": ROOT / "tfcompile", "tfcompile/passes": ROOT / "passes",
               "tfcompile/kernels": ROOT / "kernels", "tfcompile/calibration": ROOT / "calibration"}
    for prefix, src in mapping.items():
        for f in src.rglob("*.py"):
            rel = f.relative_to(src).as_posix()
            if "__pycache__" in rel:
                continue
            assert f"{prefix}/{rel}" in names, f"{f.relative_to(ROOT)} is not in the wheel (pyproject packages list)"
    # package data: the CUTLASS C++ templates emit_cutlass renders (kernels/cutlass/templates)
    templates = sorted((ROOT / "kernels" / "cutlass" / "templates").glob("*.cu.in"))
    assert templates, "kernels/cutlass/templates has no templates"
    for f in templates:
        assert f"tfcompile/kernels/cutlass/templates/{f.name}" in names, f"{f.name} is not in the wheel (package-data)"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tfcompile = tfcompile.cli.main:entry" in zipfile.ZipFile(wheel).read(entry).decode()


def test_checkout_root_does_not_shadow_the_kernels_distribution():
    """Run from the checkout's root (`python -m`/`-c` put the cwd first on sys.path), the top-level
    kernels/ folder (installed as tfcompile.kernels) must not answer `import kernels`: transformers
    >= 5.25 imports Hugging Face's `kernels` distribution from modeling_utils, and every model load
    failed with "cannot import name 'CUDAProperties' from 'kernels'" (tfcompile/__init__.py)."""
    code = ("import importlib.util, os, sys; import tfcompile; spec = importlib.util.find_spec('kernels'); "
            "origin = spec.origin if spec else None; "
            "print(origin); sys.exit(1 if origin and os.path.abspath(origin).startswith(sys.argv[1]) else 0)")
    root = str(ROOT / "kernels")
    proc = subprocess.run([sys.executable, "-c", code, root], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"`import kernels` from the checkout root finds {proc.stdout.strip()}"
