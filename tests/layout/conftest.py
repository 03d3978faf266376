"""Fixtures for the layout tests: the demo LM, a GQA and a MoE config, quantized with layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo-lm"


@pytest.fixture(scope="session")
def sources(model_factory, tmp_path_factory) -> dict[str, Path]:
    """name -> checkpoint: demo (4 heads / 2 KV heads, head_dim 64), gqa (4 heads / 1 KV head,
    head_dim 32), gqa2 (4 heads / 2 KV heads, head_dim 32), moe (Qwen3-MoE: q/k norms, 4 experts)."""
    root = tmp_path_factory.mktemp("layout-src")
    return {"demo": DEMO,
            "gqa": model_factory.make_tiny_llama(root / "gqa", kv_heads=1),
            "gqa2": model_factory.make_tiny_llama(root / "gqa2", kv_heads=2),
            "moe": model_factory.make_tiny_qwen3_moe(root / "moe")}


@pytest.fixture(scope="session")
def quantized(sources, tmp_path_factory):
    """quantized(model, fmt, *options) -> artifact dir (built once per session and worker)."""
    from tfcompile.cli.main import main

    cache: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("layout-out")

    def get(model: str, fmt: str, *opts: str) -> Path:
        key = (model, fmt) + opts
        if key not in cache:
            out = root / f"a{len(cache)}"
            code = main(["quantize", str(sources[model]), "-o", str(out), "--format", fmt, "-q", *opts])
            assert code == 0, f"quantize {key} exited {code}"
            cache[key] = out
        return cache[key]

    return get
