"""Issue 24, case 7 (the rest) and case 8's `plan --estimate` inputs: the config range check
applies to the model whatever the field spelling, `plan --estimate` uses the same check, the
calibration set and the cluster are bounded; each is exit 1 naming the field or option, at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tfcompile.errors import CheckpointError
from tfcompile.io.config_check import check_config_values

LLAMA = Path(__file__).resolve().parents[2] / "examples/configs/llama-3.1-8b/config.json"
FAST_S = 60  # a hang would run for hours; building 4096 layers on the meta device takes seconds


def _user_error(res, *needles):
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, (res.code, res.err)
    for n in needles:
        assert n in res.err, (n, res.err)


def _config(tmp_path, **changes):
    cfg = json.loads(LLAMA.read_text())
    cfg.update(changes)
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _mpt(tmp_path, layers):
    d = tmp_path / "mpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["MptForCausalLM"], "model_type": "mpt",
                                               "n_layers": layers, "d_model": 64, "n_heads": 4,
                                               "vocab_size": 128, "max_seq_len": 64}))
    return d


def test_layer_count_in_the_architectures_own_spelling(tmp_path, run_cli):
    """MPT calls its layer count `n_layers` (transformers' attribute_map: num_hidden_layers)."""
    start = time.monotonic()
    res = run_cli("quantize", _mpt(tmp_path, 10**9), "-o", tmp_path / "o", "--format", "fp8-dynamic")
    _user_error(res, "n_layers = 1000000000", "num_hidden_layers", "config.json")
    assert time.monotonic() - start < FAST_S
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("config,needle", [
    ({"model_type": "distilbert", "dim": 10**9}, "dim = 1000000000"),  # its hidden_size
    ({"model_type": "qwen2_5_vl", "vision_config": {"depth": 10**9}}, "vision_config.depth"),  # a sub-config's
])
def test_a_size_only_the_config_class_names(config, needle):
    """Spellings no name pattern catches: the config class's attribute_map maps them onto ours."""
    with pytest.raises(CheckpointError, match="this model's") as e:
        check_config_values(config, "config.json")
    assert needle in str(e.value)


def test_per_stage_sizes_are_checked_one_by_one():
    check_config_values({"model_type": "swin", "num_heads": [3, 6, 12, 24]}, "config.json")  # Swin's own
    with pytest.raises(CheckpointError, match="num_heads"):
        check_config_values({"model_type": "swin", "num_heads": [3, 10**9]}, "config.json")


@pytest.mark.parametrize("field,value", [("num_transformer_layers", 10**9), ("n_decoder_blocks", 5 * 10**6),
                                         ("num_kv_heads", 10**8), ("total_experts", 10**7)])
def test_a_count_of_layers_heads_or_experts_under_any_name(field, value):
    with pytest.raises(CheckpointError, match=field):
        check_config_values({"model_type": "not-in-transformers", field: value}, "config.json")
    check_config_values({"model_type": "not-in-transformers", field: 8, "expert_ffn_size": 10**6}, "config.json")


@pytest.mark.parametrize("changes,needle", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers = 1000000"),
    ({"hidden_size": "big"}, "hidden_size = 'big'"),
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": -8},
     "num_local_experts = -8"),
    ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_experts_per_tok": -2},
     "num_experts_per_tok = -2"),
])
def test_plan_estimate_range_checks_the_config(changes, needle, tmp_path, run_cli):
    start = time.monotonic()
    _user_error(run_cli("plan", _config(tmp_path, **changes), "--format", "nvfp4", "--estimate"), needle)
    assert time.monotonic() - start < FAST_S


def test_plan_estimate_of_an_mpt_config_with_a_billion_layers(tmp_path, run_cli):
    start = time.monotonic()
    _user_error(run_cli("plan", _mpt(tmp_path, 10**9), "--format", "nvfp4", "--estimate"), "n_layers")
    assert time.monotonic() - start < FAST_S


@pytest.mark.parametrize("text,needle", [("{}", "architectures"), ("[1, 2]", "JSON object"),
                                         ("not json", "JSON"), ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nested")],
                         ids=["empty", "list", "not-json", "deep"])
def test_plan_estimate_of_a_config_that_is_no_model(text, needle, tmp_path, run_cli):
    f = tmp_path / "config.json"
    f.write_text(text)
    _user_error(run_cli("plan", f, "--format", "nvfp4", "--estimate"), str(f), needle)


@pytest.mark.parametrize("devices,nodes", [("0xH200", 1), ("100000000000xH200", 1), ("8xH200", 10**9),
                                           ("9" * 5000 + "xH200", 1)], ids=["zero", "1e11", "1e9-nodes", "5000-digits"])
def test_plan_estimate_cluster_out_of_range(devices, nodes, run_cli):
    res = run_cli("plan", LLAMA, "--format", "nvfp4", "--estimate", "--devices", devices, "--nodes", nodes)
    _user_error(res, "--devices")


@pytest.mark.parametrize("args,needle", [
    (("--calib", "self", "--calib-samples", "100000000"), "calibrate.samples = 100000000"),
    (("--calib-samples", "1000000", "--calib-seq-len", "4096"), "samples x seq_len"),
    (("--calib-seq-len", str(10**9)), "calibrate.seq_len"),
    (("--set", "calibrate.batch=100000000"), "calibrate.batch"),
])
def test_absurd_calibration_sets_refused_before_anything_runs(args, needle, tiny_llama, tmp_path, run_cli):
    out = tmp_path / "o"
    start = time.monotonic()
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4", *args)
    _user_error(res, needle, "limit")
    assert time.monotonic() - start < FAST_S and not out.exists()
