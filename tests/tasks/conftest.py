"""Fixtures for tests/tasks: the pydoc-cloze task built once per session into a temp folder."""

from __future__ import annotations

from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"


@pytest.fixture(scope="session")
def cloze_yaml(tmp_path_factory) -> Path:
    from tfcompile.tasks import cloze

    return cloze.build(tmp_path_factory.mktemp("pydoc-cloze"))
