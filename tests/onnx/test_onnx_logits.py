"""Logits of the exported graph against tfcompile's own dequantized model (the oracle,
tfcompile/evaluate/models.py), both in float32.

Tolerance: max |Δlogit| <= 2^-8 * max |logits| — one bf16 rounding at the logits' scale.
The graph computes in float32 with the very weights the oracle dequantizes, so only the
order of float32 operations differs (measured ~1e-6 of max |logits|); a bf16 deployment
would round at 2^-8. With activation quantization on, a float32 difference of one ulp
in a Linear's input can move one element across a rounding boundary of E4M3/E2M1 (a step
of 6-50% of that element), and the change propagates; so the quantizers are checked on
identical inputs (bit for bit), the weights and graph with activation quantization
bypassed (bf16 tolerance), and the whole model end to end on the demo LM by mean error and
top-1 agreement.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx_util import (BF16_REL, activation_pair, bypass_activation_quant, oracle_logits, rel_err, run_onnx,
                       with_outputs)
from tests_helpers import tensors

FORMATS = ["fp8", "nvfp4", "mxfp4"]
RUNTIME = {"fp8": "onnxruntime", "nvfp4": "onnx.reference", "mxfp4": "onnx.reference"}


def ids_for(vocab: int, shape=(2, 16), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, vocab, shape).astype(np.int64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_and_weights_match_oracle(fmt, exported, onnx_artifact):
    ids = ids_for(256)
    (out,), runtime = run_onnx(bypass_activation_quant(onnx.load(str(exported(fmt)))), ids)
    ref = oracle_logits(onnx_artifact(fmt), ids, activations=False)
    assert runtime == RUNTIME[fmt]  # ORT 1.32's CPU kernels have no FLOAT4E2M1 DequantizeLinear
    assert rel_err(out, ref) <= BF16_REL


@pytest.mark.parametrize("fmt", FORMATS)
def test_activation_quantizer_is_the_reference(fmt, exported, onnx_artifact):
    """The exported quantize -> dequantize of down_proj's input, on the graph's own input
    values, against tfcompile.kernels.formats' activation quantizer."""
    from tfcompile.evaluate.actquant import act_quantizer
    from tfcompile.schemes import get_scheme

    model, m = onnx.load(str(exported(fmt))), "model.layers.1.mlp.down_proj"
    x_name, xq_name = activation_pair(model, "/model/layers.1/mlp/down_proj")
    (x, xq), _ = run_onnx(with_outputs(model, [x_name, xq_name]), ids_for(256), [x_name, xq_name])
    scheme = get_scheme(fmt)
    acts = scheme.acts
    static = tensors(onnx_artifact(fmt)).get(f"{m}.{acts.scale_name}") if acts.static else None
    want = act_quantizer(scheme.act, m, static)(torch.from_numpy(x)).numpy()
    if fmt == "nvfp4":  # TensorRT's op multiplies by the divisor 1/g where tfcompile divides by g:
        np.testing.assert_allclose(xq, want, rtol=2.0 ** -22, atol=0)  # <= 1-2 float32 ulps apart
    else:
        assert np.array_equal(xq, want)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_end_to_end_demo_lm(fmt, exported, onnx_artifact):
    """Everything on, on the trained demo LM: mean |Δ| within bf16 rounding, top-1 agrees."""
    ids = ids_for(4096, (1, 32), seed=3)
    (out,), _ = run_onnx(exported(fmt, "demo"), ids)
    ref = oracle_logits(onnx_artifact(fmt, "demo"), ids)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).mean() <= BF16_REL * scale
    assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


def test_fp8_kv_cache_per_head(exported, onnx_artifact):
    """--kv-cache fp8 --kv-per-head: K and V pass Q/DQ with one scale per KV head (axis 1)."""
    extra = ("--kv-cache", "fp8", "--kv-per-head")
    path = exported("nvfp4a16", "tiny", extra)
    model = onnx.load(str(path))
    kv = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and "self_attn/QuantizeLinear" in n.name]
    assert len(kv) == 4 and all(a.name != "axis" or a.i == 1 for n in kv for a in n.attribute)
    ids = ids_for(256)
    (out,), _ = run_onnx(model, ids)
    ref = oracle_logits(onnx_artifact("nvfp4a16", "tiny", extra), ids)  # emulates the FP8 KV cache
    assert rel_err(out, ref) <= BF16_REL


def test_right_padding_leaves_real_tokens_unchanged(exported):
    path = exported("bf16")
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path))
    ids = ids_for(256, (1, 10))
    full = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    padded = np.concatenate([ids, np.full((1, 4), 3)], axis=1)
    mask = np.concatenate([np.ones((1, 10)), np.zeros((1, 4))], axis=1).astype(np.int64)
    out = sess.run(None, {"input_ids": padded, "attention_mask": mask})[0]
    np.testing.assert_allclose(out[:, :10], full, rtol=0, atol=1e-5)


def test_qwen3_tied_bias_matches_transformers(tmp_path, run_cli):
    """A plain Qwen3 checkpoint (q/k norms, attention bias, tied embeddings) exports as the float
    baseline graph and matches transformers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
                      tie_word_embeddings=True, max_position_embeddings=64)
    src = tmp_path / "qwen3"
    Qwen3ForCausalLM(cfg).save_pretrained(src)
    out = tmp_path / "q.onnx"
    assert run_cli("export-onnx", src, "-o", out).code == 0
    ids = ids_for(128, (2, 12))
    (got,), runtime = run_onnx(out, ids)
    ref = Qwen3ForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert runtime == "onnxruntime" and rel_err(got, want) <= BF16_REL
