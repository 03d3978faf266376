"""Helpers for tests/report (importable by name: tests/report is on sys.path)."""

from __future__ import annotations

import contextlib
import io


def quantize_args(src, out, text, *extra: str) -> list[str]:
    """nvfp4 + FP8 KV cache + eval gates + one kernel target: every section of the report."""
    return ["quantize", str(src), "-o", str(out), "--format", "nvfp4", "--calib", "random", "--calib-samples", "2",
            "--calib-seq-len", "16", "--kv-cache", "fp8", "--layout", "vllm", "--target", "sm_100a", "--eval",
            "--eval-text", str(text), "--eval-max-tokens", "256", "--max-kl", "5", "--min-top1", "0.01", "-q", *extra]


def run_main(args: list[str]) -> tuple[int, str, str]:
    from tfcompile.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()
