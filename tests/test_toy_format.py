"""A new format reaches the consumers that ask the format (issue 25 item 2): register a toy one in
the two places a format is described (its weight quantizer in kernels/formats/quantizer.py
`WEIGHT_FORMATS`, its scheme in tfcompile/schemes.py `SCHEMES`) and mixed precision, the plan
estimate, the engine configs, the ONNX checks, the runtime's synthetic weights and the algorithms'
capability checks take it with no further edit (before, the tables keyed by format name raised
KeyError or refused it).

The toy: "toy4", E2M1 codes packed two per byte with one E8M0 scale per 64 elements along K
(MXFP4 with twice the block), weight-only; 4 + 8/64 = 4.125 bits per weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tfcompile.kernels.formats import quantizer as Q
from tfcompile.schemes import SCHEMES, Scheme, get_scheme

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-lm"
TOY = Scheme("toy4", "toy4", "group", (64,), None, False, "MXFP4A16", "mxfp4-pack-quantized", None,
             "toy: E2M1 weights, E8M0 scales per 64", modelopt_group_size=64)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(Q.WEIGHT_FORMATS, "toy4", lambda granularity, block: Q.MXWeights(
        "toy4", "group", (64,), True, "e2m1", 64, Q.DEFAULT_MX_RULE, True))
    monkeypatch.setitem(SCHEMES, "toy4", TOY)
    yield get_scheme("toy4")
    Q.weight_quantizer.cache_clear()  # drop the toy's cached quantizer


def test_the_toy_states_its_facts(toy):
    assert toy.bits_per_weight == 4 + 8 / 64 and toy.k_multiple == 64 and toy.packed
    assert toy.weights.block_scaled and not toy.shares_global_scale


def test_mixed_search_prices_it(toy):
    from tfcompile.mixed.search import GroupCost, bits, choose, summary

    costs = [GroupCost("a", 100, {"toy4": 1.0, "nvfp4": 0.5, "bf16": 0.0}),
             GroupCost("b", 100, {"toy4": 0.2, "nvfp4": 0.1, "bf16": 0.0})]
    pick = choose(costs, "toy4", avg_bits=(4.125 + 4.5) / 2)  # room for one group in nvfp4
    assert bits("toy4") == 4.125 and pick == {"a": "nvfp4", "b": "toy4"}
    assert summary(costs, pick)["avg_bits"] == pytest.approx((4.125 + 4.5) / 2)


def _quantized_params(cfg: dict) -> int:
    """Weights of the decoder Linears (q, k, v, o, gate, up, down; lm_head stays), from config.json."""
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    attn = h * d * (2 * cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"])
    return cfg["num_hidden_layers"] * (attn + 3 * h * i)


def test_plan_estimate_sizes_it_to_the_byte(toy):
    from tfcompile.estimate.plan import estimate
    from tfcompile.recipe.build import build_recipe

    toy_bytes = estimate(DEMO, build_recipe(fmt="toy4"))["output_bytes"]
    mx_bytes = estimate(DEMO, build_recipe(fmt="mxfp4a16"))["output_bytes"]
    params = _quantized_params(json.loads((DEMO / "config.json").read_text()))
    assert mx_bytes - toy_bytes == params // 32 - params // 64  # the same codes, half the E8M0 scales


def test_engine_configs_take_it(toy):
    from tfcompile.artifact.configs import ct_quantization_config, modelopt_quant_config

    hf, cfg = modelopt_quant_config(toy, [])
    assert hf["quantization"]["group_size"] == 64 and "config_groups" not in cfg
    assert ct_quantization_config(toy, [])["format"] == "mxfp4-pack-quantized"


def test_onnx_checks_use_its_block(toy, tmp_path):
    from tfcompile.onnx_export.config import OnnxExportError
    from tfcompile.onnx_export.source import ArtifactView, check_exportable

    cfg = {"architectures": ["LlamaForCausalLM"]}
    check_exportable(ArtifactView(tmp_path, cfg, toy, {"m": (8, 128)}), 23)
    with pytest.raises(OnnxExportError, match="block size 64"):
        check_exportable(ArtifactView(tmp_path, cfg, toy, {"m": (8, 96)}), 23)


def test_runtime_synthetic_weights_follow_its_layout(toy):
    from tfcompile.runtime.bindings import synthetic_weights

    w = synthetic_weights(toy, 128, 256, "cpu")
    assert w.data.shape == (128, 128) and w.data.dtype == torch.uint8
    assert w.scale.shape == (128, 4) and w.scale.dtype == torch.uint8  # E8M0 per 64


def test_algorithms_ask_it(toy):
    from tfcompile.passes.quantize.awq import unsupported
    from tfcompile.passes.quantize.mse import search_of

    assert unsupported(toy) is None  # AWQ quantizes through its WeightQuantizer
    assert search_of(toy.weights) is None  # no block-scale search for 64-blocks: RTN's scales
    assert search_of(get_scheme("mxfp4").weights) is not None
