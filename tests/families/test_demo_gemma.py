"""The committed Gemma-3-style demo model (examples/demo-gemma, scripts/train_demo_lm.py --family gemma3).

A second trained family beside examples/demo-lm (issue 33): (1 + w) RMSNorm, pre- and post-norms
around attention and MLP, q/k norms, GeGLU, tied and scaled embeddings. It must load as
Gemma3ForCausalLM, predict held-out text far better than chance, quantize to every format with
tfcompile (q/k/v and gate/up fused; the tied lm_head kept), verify, and score with `tfcompile eval`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tfcompile.calibration.corpus import iter_token_blocks, python_doc_texts

REPO = Path(__file__).resolve().parents[2]
DEMO_GEMMA = REPO / "examples" / "demo-gemma"

# Held-out perplexity of the committed model on the first 8 blocks of 256 tokens of the heldout split
# (bf16 weights computed in fp32), measured on the checkpoint TRAINING.md describes; the bound leaves
# ~10% for other CPUs' float rounding (untrained: ~4300).
MEASURED_PPL = 26.51
PPL_BOUND = 29.2


def test_committed_demo_gemma_has_gemma3_structure_and_predicts_held_out_text():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert sum(p.stat().st_size for p in DEMO_GEMMA.iterdir()) < 25e6
    model = AutoModelForCausalLM.from_pretrained(DEMO_GEMMA, dtype=torch.float32).eval()
    cfg, layer = model.config, model.model.layers[0]
    assert type(model).__name__ == "Gemma3ForCausalLM" and cfg.model_type == "gemma3_text"
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert hasattr(layer, "post_attention_layernorm") and hasattr(layer, "post_feedforward_layernorm")
    assert hasattr(layer.self_attn, "q_norm") and cfg.hidden_activation == "gelu_pytorch_tanh"
    assert all(m.in_features % 128 == 0 for m in model.modules() if isinstance(m, torch.nn.Linear))
    # (1 + w) norms: trained weights sit around 0, not 1
    assert abs(float(layer.input_layernorm.weight.detach().mean())) < 0.5
    tok = AutoTokenizer.from_pretrained(DEMO_GEMMA)
    blocks = torch.tensor(list(iter_token_blocks(tok, python_doc_texts("heldout"), 256, 8)))
    with torch.no_grad():
        logits = model(input_ids=blocks).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))
    ppl = math.exp(nll.item())
    assert ppl < PPL_BOUND, f"held-out perplexity {ppl:.2f} (measured {MEASURED_PPL})"


@pytest.mark.parametrize("fmt", ["nvfp4a16", "nvfp4", "mxfp4a16", "mxfp4", "mxfp8", "fp8", "fp8-dynamic",
                                 "fp8-block"])
def test_committed_demo_gemma_quantizes_to_every_format_and_verifies(run_cli, tmp_path, fmt):
    out = tmp_path / f"demo-gemma-{fmt}"
    calib = ["--calib-samples", "4", "--calib-seq-len", "64"] if fmt in ("nvfp4", "fp8") else []  # static inputs
    r = run_cli("quantize", DEMO_GEMMA, "-o", out, "--format", fmt, *calib)
    assert r.code == 0, r.err
    assert run_cli("verify", out).code == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "lm_head" in qc["ignore"]  # tied: the embedding is kept
    layers = json.loads((out / "tfcompile" / "manifest.json").read_text())["layers"]
    assert len(layers) == 7 * 4  # q, k, v, o, gate, up, down per layer


def test_committed_demo_gemma_scores_with_tfcompile_eval(run_cli, tmp_path):
    out = tmp_path / "demo-gemma-nvfp4a16"
    assert run_cli("quantize", DEMO_GEMMA, "-o", out, "--format", "nvfp4a16").code == 0
    r = run_cli("eval", out, "--reference", DEMO_GEMMA, "--max-tokens", "1024", "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)["metrics"]
    assert 1.0 < res["perplexity"] < 2 * res["reference_perplexity"] and res["predicted_tokens"] > 1000
