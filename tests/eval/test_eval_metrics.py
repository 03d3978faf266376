"""Metrics of `tfcompile eval` against computations done here, and the W4A4 emulation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

SEQ, TOKENS = 64, 256


def _rows(reference, text_path) -> torch.Tensor:
    """The evaluation tokens as eval cuts them: no special tokens, first TOKENS, rows of SEQ."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(reference))
    ids = tok(text_path.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"][:TOKENS]
    return torch.tensor(ids).reshape(-1, SEQ)


def _dequantized_model(source, artifact) -> torch.nn.Module:
    """The float32 source model with each quantized Linear's weight decoded here from the
    artifact's safetensors (independently of tfcompile.evaluate)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tfcompile.kernels.formats import QTensor, dequantize

    t = load_file(str(artifact / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    mods = dict(model.named_modules())
    n = 0
    for name in t:
        if name.endswith(".weight_packed"):  # NVFP4 (W4A16): packed e2m1, e4m3 scales, fp32 global
            m = name[: -len(".weight_packed")]
            packed = t[name]
            q = QTensor("nvfp4", packed, t[f"{m}.weight_scale"], t[f"{m}.weight_global_scale"].float(),
                        (packed.shape[0], packed.shape[1] * 2), "group", None, (16,))
            with torch.no_grad():
                mods[m].weight.copy_(dequantize(q))
            n += 1
    assert n == 14
    return model


def test_metrics_match_independent_computation(run_cli, eval_artifact, tiny_llama_src, eval_text):
    art = eval_artifact("nvfp4a16")
    r = run_cli("eval", art, "--reference", tiny_llama_src, "--text", eval_text, "--max-tokens", TOKENS,
                "--seq-len", SEQ, "--batch-size", 3, "--json")
    assert r.code == 0, r.err
    m = r.json()["metrics"]

    ids = _rows(tiny_llama_src, eval_text)
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.float32).eval()
    model = _dequantized_model(tiny_llama_src, art)
    with torch.no_grad():
        lr, lm = ref(input_ids=ids).logits, model(input_ids=ids).logits
    v = lr.shape[-1]
    ce = F.cross_entropy(lm[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    ce_ref = F.cross_entropy(lr[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    kl = F.kl_div(F.log_softmax(lm, -1).reshape(-1, v), F.log_softmax(lr, -1).reshape(-1, v),
                  reduction="batchmean", log_target=True)
    top1 = (lm.argmax(-1) == lr.argmax(-1)).float().mean()

    assert m["perplexity"] == pytest.approx(math.exp(ce.item()), rel=1e-5)
    assert m["reference_perplexity"] == pytest.approx(math.exp(ce_ref.item()), rel=1e-5)
    assert m["ppl_increase"] == pytest.approx(math.exp(ce.item() - ce_ref.item()) - 1, rel=1e-3, abs=1e-6)
    assert m["kl_mean"] == pytest.approx(kl.item(), rel=1e-3, abs=1e-8)
    assert m["top1_agreement"] == pytest.approx(top1.item())


def test_w4a4_emulation_changes_logits(eval_artifact):
    """nvfp4 (W4A4) with max-based scales and nvfp4a16 store the same weights; only the activation
    emulation differs (W4A4 RTN's default searches its scales by output error: pinned off here)."""
    from safetensors.torch import load_file

    from tfcompile.evaluate.models import load_candidate

    a4, a16 = eval_artifact("nvfp4", "quantize.scale_search=none"), eval_artifact("nvfp4a16")
    t4, t16 = load_file(str(a4 / "model.safetensors")), load_file(str(a16 / "model.safetensors"))
    for name, t in t16.items():
        assert torch.equal(t4[name], t), name  # identical weights and weight scales
    assert {n for n in t4 if n.endswith(".input_global_scale")}  # W4A4 adds static input scales

    w4, w16 = load_candidate(a4, torch.float32), load_candidate(a16, torch.float32)
    assert all(q.act is not None for q in w4.linears.values())
    assert all(q.act is None for q in w16.linears.values())
    ids = torch.arange(4, 68).reshape(1, 64)
    with torch.no_grad():
        l4, l16 = w4.model(input_ids=ids).logits, w16.model(input_ids=ids).logits
        for q in w4.linears.values():  # the weights really are the same
            assert torch.equal(q.module.weight, w16.linears[q.name].module.weight)
    diff = (l4 - l16).abs().max().item()
    assert diff > 1e-3, diff
    # the emulation is NVFP4 quantize -> dequantize of the Linear's input: on its own output it is
    # idempotent (values already on the grid with the same global scale)
    x = torch.randn(2, 8, 128)
    act = w4.linears["model.layers.0.self_attn.q_proj"].act
    once = act(x)
    assert not torch.equal(once, x) and torch.equal(act(once), once)
