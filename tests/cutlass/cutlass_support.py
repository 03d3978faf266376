"""Helpers for tests/cutlass (importable by name: tests/cutlass is on sys.path)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
DEMO_SHAPES = {(256, 256), (128, 256), (768, 256), (256, 768)}  # q/o, k/v, gate/up, down
CALIB = ("--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16")
TARGETS = ("--set", "emit_cutlass.targets=sm_90a,sm_100a")


# The demo-LM builds: variant -> (format, extra settings). One real nvcc build per target runs in
# the default job ("fp8-one": sm_90a, one M bucket so one schedule; "nvfp4": sm_100a); the slow job
# (CI's second step) adds both sm_90a schedules ("fp8") and MXFP4 ("mxfp4").
VARIANTS = {"fp8-one": ("fp8", ("--set", "emit_cutlass.buckets=[1]")), "fp8": ("fp8", ()),
            "nvfp4": ("nvfp4", ()), "mxfp4": ("mxfp4", ())}


def demo_args(fmt: str) -> tuple[str, ...]:
    """The emit_cutlass settings the demo-LM tests build with. CI time: every source is a 35-70 s
    nvcc build on an idle 2-core box (several minutes on a loaded one), so the FP4 formats take
    one config (slack 1.25: the cost model predicts the second within 25% on the demo's tiny
    shapes); FP8 keeps the default (1.1), which compiles both sm_90a schedules (ping-pong 64x128
    and cooperative 128x256) unless the variant keeps one M bucket."""
    fmt, extra = VARIANTS.get(fmt, (fmt, ()))
    slack = ("--set", "emit_cutlass.slack=1.25") if fmt in ("nvfp4", "mxfp4") else ()
    return (*TARGETS, "--set", "emit_cutlass.compile=always", *slack, *extra)


def variant_format(variant: str) -> str:
    return VARIANTS.get(variant, (variant, ()))[0]


def have_toolchain() -> bool:
    from tfcompile.kernels.cutlass.toolchain import detect

    return detect().why_not is None


needs_nvcc = pytest.mark.skipif(not have_toolchain(), reason="needs nvcc 12.8+ and the nvidia-cutlass headers")


def quantize(src: Path, out: Path, fmt: str, *extra: str) -> dict:
    """`tfcompile quantize --json` in-process; asserts success; returns the JSON document."""
    from tfcompile.cli.main import main

    calib = CALIB if fmt in ("nvfp4", "fp8") else ()
    args = ["quantize", str(src), "-o", str(out), "--format", fmt, "--json", *calib, *extra]
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()) as so:
        code = main(args)
    assert code == 0, err.getvalue()
    return json.loads(so.getvalue())


def pass_stats(doc: dict, name: str) -> dict:
    """A pass's stats from `quantize --json` ({"passes": {name: {stat: value, "seconds": s}}})."""
    return doc["passes"][name]


def triton_bin(name: str) -> str:
    """cuobjdump / nvdisasm from the triton wheel (what every tfcompile install has)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    assert path.is_file(), path
    return str(path)
