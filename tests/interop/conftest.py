"""Session fixtures for tests/interop: each format is quantized once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from interop_util import run_tfcompile  # noqa: E402


class _Artifacts:
    """Lazily quantize `source` per (format, extra CLI args); cached for the session."""

    def __init__(self, source: Path, root: Path):
        self.source, self.root, self._cache = source, root, {}

    def __call__(self, fmt: str, *extra: str) -> Path:
        key = (fmt, extra)
        if key not in self._cache:
            tag = fmt + "".join("_" + e.strip("-").replace("=", "-") for e in extra)
            self._cache[key] = run_tfcompile(self.source, self.root / tag, fmt, *extra)
        return self._cache[key]


@pytest.fixture(scope="session")
def llama_artifact(tiny_llama_src, tmp_path_factory):
    """llama_artifact("nvfp4") -> path of the tiny Llama quantized in that format."""
    return _Artifacts(tiny_llama_src, tmp_path_factory.mktemp("interop-artifacts"))
