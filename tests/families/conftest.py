"""Session fixtures for tests/families: each tiny family model is built once, each artifact made once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families_util import load_fixture, quantize  # noqa: E402


@pytest.fixture(scope="session")
def families():
    """tests/fixtures/families.py (FAMILIES, make_tiny_*)."""
    return load_fixture("families")


@pytest.fixture(scope="session")
def published():
    """tests/fixtures/published.py (published formats and their reference decoders)."""
    return load_fixture("published")


@pytest.fixture(scope="session")
def family_src(families, tmp_path_factory):
    """family_src("gpt_oss") -> the tiny checkpoint directory (built once per session)."""
    root, cache = tmp_path_factory.mktemp("families"), {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = families.FAMILIES[name].build(root / name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def family_artifact(family_src, tmp_path_factory):
    """family_artifact("gpt_oss", "nvfp4", *extra) -> artifact directory (made once per session)."""
    root, cache = tmp_path_factory.mktemp("family-artifacts"), {}

    def get(name: str, fmt: str, *extra: str) -> Path:
        key = (name, fmt, extra)
        if key not in cache:
            tag = "-".join([name, fmt] + [e.strip("-").replace("=", "_").replace("/", "_") for e in extra])
            cache[key] = quantize(family_src(name), root / tag, fmt, *extra)
        return cache[key]

    return get
