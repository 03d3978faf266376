"""Every way of distilling runs end to end and ships a verified artifact: scales only, LoRA
merged before packing, block-wise (layerwise), the top-k teacher cache, hidden-state MSE."""

from __future__ import annotations

import json

import pytest
import torch
from tests_helpers import tensors


@pytest.fixture(scope="module")
def rtn(tiny_llama_src, tmp_path_factory):
    """Plain round-to-nearest artifacts to compare with, per format."""
    from tfcompile.cli.main import main

    cache = {}

    def get(fmt):
        if fmt not in cache:
            out = tmp_path_factory.mktemp("rtn") / fmt
            assert main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", fmt, "-q"]) == 0
            cache[fmt] = tensors(out)
        return cache[fmt]

    return get


CASES = {
    "scales": ("nvfp4a16", ["--train", "scales"]),
    "lora": ("mxfp4", ["--train", "lora", "--set", "distill.lora_rank=4"]),
    "layerwise": ("mxfp4a16", ["--mode", "layerwise", "--set", "distill.layer_samples=4"]),
    # no held-out figures: one model, turned into the student layer by layer
    "layerwise-once": ("nvfp4a16", ["--mode", "layerwise", "--set", "distill.layer_samples=4",
                                    "--set", "distill.heldout_tokens=0", "--train", "lora"]),
    "cache": ("nvfp4a16", ["--teacher", "cache", "--set", "distill.topk=8", "--set", "distill.ce_weight=0.5"]),
    "hidden": ("mxfp8", ["--set", "distill.hidden_weight=1", "--set", "distill.temperature=2",
                         "--grad-accum", "2"]),
    "unquantized": ("nvfp4a16", ["--set", "distill.train_unquantized=true", "--set", "distill.lr=1e-3"]),
}


# the default job trains the scales (logit distillation) and one layerwise run; the slow job the rest
DEFAULT_JOB = ("scales", "layerwise")


@pytest.mark.parametrize("case", [c if c in DEFAULT_JOB else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_mode_runs_and_changes_weights(case, tiny_llama_src, fast, distill_text, tmp_path, run_cli, rtn):
    fmt, extra = CASES[case]
    out = tmp_path / "out"
    res = run_cli("distill", tiny_llama_src, "-o", out, "--format", fmt, *fast, *extra, "--json")
    assert res.code == 0, res.err
    assert run_cli("verify", out).code == 0
    d = json.loads((out / "tfcompile" / "manifest.json").read_text())["distill"]
    loss = d["final_loss"]
    if case.startswith("layerwise"):
        assert d["steps"] == 4 * 2 and "layer_mse" in loss  # steps per layer x 2 layers
    assert (d["heldout"]["after"] is None) == (case == "layerwise-once")
    if case == "cache":
        assert {"kl", "ce"} <= set(loss) and (tmp_path / "out").is_dir()
    if case == "hidden":
        assert loss["hidden"] > 0
    ours, base = tensors(out), rtn(fmt)
    assert ours.keys() == base.keys()
    changed = [n for n in ours if not torch.equal(ours[n], base[n])]
    if case == "unquantized":  # norms, embeddings and lm_head trained too, stored in bf16
        assert {"lm_head.weight", "model.norm.weight", "model.embed_tokens.weight"} <= set(changed)
        assert ours["lm_head.weight"].dtype == torch.bfloat16
        assert d["trained_tensors"] == 14 + 2 * 2 + 3
        from test_distill_cli import check_figures_equal_eval  # the student is still the artifact

        check_figures_equal_eval(out, tiny_llama_src, distill_text, tmp_path, run_cli)
    else:
        assert changed and all(".layers." in n for n in changed)  # only quantized Linears moved
