"""Fixtures for tests/onnx: artifacts of the tiny Llama and of the demo LM, built once per session."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

DEMO_LM = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
CALIB = ["--calib", "random", "--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16"]


def _quantize(src: Path, out: Path, fmt: str, *extra: str) -> Path:
    from tfcompile.cli.main import main

    args = CALIB if fmt in ("nvfp4", "fp8") or "--kv-cache" in extra else []
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["quantize", str(src), "-o", str(out), "--format", fmt, "-q", *args, *extra])
    assert code == 0, err.getvalue()[-3000:]
    return out


@pytest.fixture(scope="session")
def onnx_artifact(tiny_llama_src, tmp_path_factory):
    """onnx_artifact("nvfp4", model="tiny"|"demo", extra=(...)) -> that artifact (cached per session)."""
    root, cache = tmp_path_factory.mktemp("onnx-artifacts"), {}

    def get(fmt: str, model: str = "tiny", extra: tuple[str, ...] = ()):
        key = (fmt, model, extra)
        if key not in cache:
            src = tiny_llama_src if model == "tiny" else DEMO_LM
            cache[key] = _quantize(src, root / f"{model}-{fmt}-{len(cache)}", fmt, *extra)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def exported(onnx_artifact, tiny_llama_src, tmp_path_factory):
    """exported("mxfp4", model=...) -> the .onnx of that artifact via the library (cached);
    fmt "bf16" exports the source checkpoint itself (the float baseline)."""
    from tfcompile.onnx_export import OnnxExportConfig, export_to_path, view_from_path

    root, cache = tmp_path_factory.mktemp("onnx-exports"), {}

    def get(fmt: str, model: str = "tiny", extra: tuple[str, ...] = ()):
        key = (fmt, model, extra)
        if key not in cache:
            src = (tiny_llama_src if model == "tiny" else DEMO_LM) if fmt == "bf16" else onnx_artifact(fmt, model, extra)
            out = root / f"{model}-{fmt}-{len(cache)}.onnx"
            cache[key] = export_to_path(view_from_path(src), out, OnnxExportConfig()).path
        return cache[key]

    return get
