"""Our compressed-tensors quantization_config equals compressed-tensors' own dump (the oracle)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import compressed_tensors
import pytest

from tfcompile.artifact.configs import ct_quantization_config
from tfcompile.schemes import SCHEMES

_GEN = Path(__file__).resolve().parents[2] / "scripts" / "gen_ct_presets.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_ct_presets", _GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_config_equals_compressed_tensors_dump(name):
    scheme, ignore = SCHEMES[name], ["lm_head", "model.layers.0.mlp.gate"]
    ours = ct_quantization_config(scheme, ignore)
    live = _gen().live_body(scheme.ct_preset, scheme.ct_format, sorted(ignore))
    assert ours["version"] == compressed_tensors.__version__
    assert ours["quant_method"] == "compressed-tensors"
    body = {k: v for k, v in ours.items()
            if k not in ("version", "quant_method", "sparsity_config", "transform_config")}
    assert body == live


@pytest.mark.parametrize("kv", ["tensor", "attn_head"])
def test_kv_cache_scheme_equals_compressed_tensors_dump(kv):
    scheme = SCHEMES["nvfp4a16"]
    ours = ct_quantization_config(scheme, [], kv)
    live = _gen().live_body(scheme.ct_preset, scheme.ct_format, [], kv)
    assert ours["kv_cache_scheme"] == live["kv_cache_scheme"] and live["kv_cache_scheme"]["strategy"] == kv


def test_quantize_path_does_not_import_compressed_tensors():
    import subprocess
    import sys

    code = ("import sys, tfcompile.passes.builtin, tfcompile.artifact.configs, tfcompile.cli.main;"
            "print('compressed_tensors' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
