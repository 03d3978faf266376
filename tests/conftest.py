"""Shared fixtures: tiny real checkpoints built in code, and a CLI runner."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import sys

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests_helpers, fixtures

# a CPU test may not be skipped (tests/skip_guard.py: exit 1 unless marked gpu / cpu_only)
from skip_guard import (pytest_collectreport, pytest_runtest_logreport, pytest_sessionfinish,  # noqa: E402,F401
                        pytest_terminal_summary)
# the Debian packages of .ci/apt-packages: a missing one stops the run at its start, named
from system_packages import pytest_configure  # noqa: E402,F401

_MODELS = Path(__file__).resolve().parent / "fixtures" / "models.py"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:  # property tests: reproducible in CI, no per-example deadline on a shared 2-core box
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile("dev", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:
    pass
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The built-in passes register themselves when an entry point imports them (tfcompile.api, the
# CLI); tests that build recipes or run the pass manager directly get them the same way.
import tfcompile.api  # noqa: E402,F401


def load_models_module():
    spec = importlib.util.spec_from_file_location("tfcompile_test_models_shared", _MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def model_factory():
    """tests/fixtures/models.py: make_tiny_llama, make_tiny_qwen3_moe, ..."""
    return load_models_module()


@pytest.fixture(scope="session")
def family_factory():
    """tests/fixtures/families.py: FAMILIES (name -> Family(build, architecture, moe)) and make_tiny_*:
    DeepSeek-V3/Kimi K2, GPT-OSS, GLM-4.5, Qwen3 (dense, MoE, Next), Qwen2.5-VL (docs/models.md)."""
    spec = importlib.util.spec_from_file_location("tfcompile_test_families_shared", _MODELS.with_name("families.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def random_mtp(family_factory, tmp_path_factory):
    """{family: a tiny checkpoint (tests/fixtures/families.py) with a random MTP layer}, built on first use."""
    made = {}

    def get(family):
        if family not in made:
            out = tmp_path_factory.mktemp("mtpfam") / family
            if family == "qwen3_5":
                made[family] = family_factory.add_qwen3_5_mtp(family_factory.make_tiny_qwen3_5(out, layers=4))
            else:
                build = family_factory.FAMILIES[family].build
                made[family] = family_factory.add_mtp_layer(build(out, layers=2, dense=1))
        return made[family]
    return get


@pytest.fixture(scope="session")
def tiny_llama_src(model_factory, tmp_path_factory) -> Path:
    return model_factory.make_tiny_llama(tmp_path_factory.mktemp("src") / "tiny-llama")


@pytest.fixture
def tiny_llama(tiny_llama_src, tmp_path) -> Path:
    """A private copy (tests may corrupt it)."""
    dst = tmp_path / "tiny-llama"
    shutil.copytree(tiny_llama_src, dst)
    return dst


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture
def run_cli(capsys):
    """Run `tfcompile ARGS...` in-process; returns exit code, stdout and stderr."""
    from tfcompile.cli.main import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return run


@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same RNG state, so random inputs are reproducible."""
    import torch

    torch.manual_seed(0)
