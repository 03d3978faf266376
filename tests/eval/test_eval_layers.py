"""The per-layer eval figures (isolated / end-to-end output SQNR per Linear, KL per decoder layer
through the logit lens) against a direct computation here, layer by layer, on the tiny Llama.

The oracle model is built here: the float32 source with each quantized weight decoded from the
artifact's safetensors and NVFP4 activations quantized by forward pre-hooks with the stored
input_global_scale (tfcompile.kernels.formats, whose codecs tests/kernels check against
compressed-tensors / ml_dtypes); the sums are float64, every Linear's reference input is captured
by this file's own hooks, and the lens goes through norm + lm_head for every layer, the last one
included (the eval takes that one from the logits)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

SEQ, TOKENS, LENS = 64, 256, 100  # LENS: the lens's positions, spread over all four rows


def _lens_picks(total: int, n: int) -> list[int]:
    """The lens's positions as docs/cli.md defines them: position k of n at floor((k + 1/2) total / n)."""
    return [(2 * k + 1) * total // (2 * n) for k in range(n)]


def _oracle(source, artifact, w4a4: bool) -> torch.nn.Module:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tfcompile.kernels.formats import QTensor, dequantize, quantize_nvfp4_act

    t = load_file(str(artifact / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    mods = dict(model.named_modules())
    model.quantized = {}
    for name in t:
        if not name.endswith(".weight_packed"):
            continue
        m, packed = name[: -len(".weight_packed")], t[name]
        q = QTensor("nvfp4", packed, t[f"{m}.weight_scale"], t[f"{m}.weight_global_scale"].float(),
                    (packed.shape[0], packed.shape[1] * 2), "group", None, (16,))
        with torch.no_grad():
            mods[m].weight.copy_(dequantize(q))
        act = None
        if w4a4:
            g = t[f"{m}.input_global_scale"].float().reshape(1)
            act = (lambda g: lambda x: dequantize(quantize_nvfp4_act(x, g)).to(x.dtype))(g)
            mods[m].register_forward_pre_hook((lambda a: lambda _m, args: (a(args[0]),))(act))
        model.quantized[m] = act
    assert len(model.quantized) == 14
    return model


def _capture(model, names, inputs=False):
    out, hooks = {}, []
    mods = dict(model.named_modules())
    for n in names:
        def hook(_m, args, y, n=n):
            out.setdefault(n, []).append((args[0] if inputs else y).detach().reshape(-1, y.shape[-1] if not inputs
                                                                                      else args[0].shape[-1]))
        hooks.append(mods[n].register_forward_hook(hook))
    return out, hooks


def _direct_sqnr(ref, cand, ids, iso_positions=None):
    """{module: (isolated dB, end-to-end dB)} from the oracle model, float64 sums; the isolated
    figure on the first `iso_positions` positions (row-major), the end-to-end one on all."""
    names = sorted(cand.quantized)
    xs, h1 = _capture(ref, names, inputs=True)
    ys, h2 = _capture(ref, names)
    ye, h3 = _capture(cand, names)
    with torch.no_grad():
        ref(input_ids=ids), cand(input_ids=ids)
    for h in h1 + h2 + h3:
        h.remove()
    mods = dict(cand.named_modules())
    out = {}
    for n in names:
        x, y, y2 = torch.cat(xs[n]), torch.cat(ys[n]).double(), torch.cat(ye[n]).double()
        act = cand.quantized[n]
        with torch.no_grad():
            y_iso = F.linear((act(x) if act else x).double(), mods[n].weight.double())
        p = iso_positions or len(y)
        out[n] = (10 * math.log10(float(y[:p].square().sum()) / float((y[:p] - y_iso[:p]).square().sum())),
                  10 * math.log10(float(y.square().sum()) / float((y - y2).square().sum())))
    return out


def _direct_lens(ref, cand, ids, picks):
    """Per decoder layer: mean KL(ref || cand) over the positions `picks` (row-major indices),
    every layer (the last one too) through the model's final norm and lm_head, float64."""
    layers = len(ref.model.layers)
    hs = {}
    hooks = [m.model.layers[i].register_forward_hook(
        lambda _m, _a, out, key=(tag, i): hs.__setitem__(key, out[0] if isinstance(out, tuple) else out))
        for tag, m in (("r", ref), ("c", cand)) for i in range(layers)]
    with torch.no_grad():
        ref(input_ids=ids), cand(input_ids=ids)
        out = []
        for i in range(layers):
            lens = [m.lm_head(m.model.norm(hs[(tag, i)])).double().reshape(-1, m.config.vocab_size)[picks]
                    for tag, m in (("r", ref), ("c", cand))]
            lpr, lp = (F.log_softmax(z, -1) for z in lens)
            out.append(float((lpr.exp() * (lpr - lp)).sum(-1).mean()))
    for h in hooks:
        h.remove()
    return out


def _rows(src, text):
    from tfcompile.evaluate.text import load_tokenizer, token_rows

    return token_rows(text.read_text(encoding="utf-8"), load_tokenizer(src), max_tokens=TOKENS, seq_len=SEQ,
                      vocab=256)


@pytest.mark.parametrize("fmt,iso", [("nvfp4", None), ("nvfp4a16", None), ("nvfp4", 150)])
def test_layer_sqnr_and_lens_kl_match_a_direct_computation(eval_artifact, tiny_llama_src, eval_text, fmt, iso,
                                                           monkeypatch):
    """iso: a cap on the isolated SQNR's positions inside the third row (the first batch, rows 0-2, holds
    positions 0-191: the cap splits it and the second batch takes none); None: the default cap, above
    the 256 tokens here."""
    from transformers import AutoModelForCausalLM

    from tfcompile.evaluate import runner
    from tfcompile.evaluate.lens import LayerKL
    from tfcompile.evaluate.metrics import LayerSQNR
    from tfcompile.evaluate.models import load_candidate
    from tfcompile.evaluate.text import batches

    if iso is not None:
        monkeypatch.setattr(LayerSQNR, "MAX_POSITIONS", iso)
    assert LayerSQNR.MAX_POSITIONS >= TOKENS or iso is not None

    art = eval_artifact(fmt)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.float32).eval()
    rows = _rows(tiny_llama_src, eval_text)
    assert len(rows) == TOKENS // SEQ
    cand, lens = load_candidate(art, torch.float32), LayerKL(max_positions=LENS)
    _, layer_m = runner._run(cand, ref, batches(rows, 3), None, lens)  # batches of 3 rows and 1 row

    oracle, ids = _oracle(tiny_llama_src, art, fmt == "nvfp4"), torch.stack(rows)
    direct = _direct_sqnr(ref, oracle, ids, iso)
    got = {r["module"]: r for r in layer_m.result()}
    assert sorted(got) == sorted(direct)
    for n, (iso, e2e) in direct.items():
        assert got[n]["sqnr_db"] == pytest.approx(iso, abs=2e-3), n
        assert got[n]["e2e_sqnr_db"] == pytest.approx(e2e, abs=2e-3), n
    assert lens.positions == LENS
    picks = _lens_picks(TOKENS, LENS)
    assert len(set(picks)) == LENS and {p // SEQ for p in picks} == {0, 1, 2, 3}  # every row, none twice
    want = _direct_lens(ref, oracle, ids, picks)
    assert [r["kl_mean"] for r in lens.result()] == pytest.approx(want, rel=1e-4, abs=1e-8)
    assert all(k > 0 for k in want)


def test_shared_inputs_are_quantized_once_bit_for_bit(eval_artifact, tiny_llama_src, eval_text):
    """q/k/v and gate/up read one reference input with one quantizer: the isolated SQNR quantizes
    it once (4 emulations per decoder layer, not 7), with the figures of one emulation each."""
    from transformers import AutoModelForCausalLM

    from tfcompile.evaluate import runner
    from tfcompile.evaluate.models import load_candidate
    from tfcompile.evaluate.text import batches

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.float32).eval()
    work = batches(_rows(tiny_llama_src, eval_text), 3)
    cand = load_candidate(eval_artifact("nvfp4"), torch.float32)
    keys = {n: q.act_key for n, q in cand.linears.items()}
    assert keys["model.layers.0.self_attn.q_proj"] == keys["model.layers.0.self_attn.v_proj"]  # one amax
    calls = []
    for q in cand.linears.values():  # the candidate's own pre-hooks keep the original function
        q.act = (lambda f, n: lambda x: calls.append(n) or f(x))(q.act, q.name)
    shared = runner._run(cand, ref, work, None)[1].result()
    assert len(calls) == len(work) * 2 * 4
    for q in cand.linears.values():
        q.act_key = None  # no sharing
    calls.clear()
    alone = runner._run(cand, ref, work, None)[1].result()
    assert len(calls) == len(work) * 14 and alone == shared


def test_lens_positions_keep_the_lens_within_its_share_of_a_plain_eval():
    """The lens's count (lens.lens_positions): every position of a short evaluation, else as many as
    keep its matmul work within LENS_WORK_SHARE of a plain eval's, within [MIN, MAX]; SmolLM2's
    shapes (30 layers of 3.54 M Linear weights, lm_head 49,152 x 576) at 4,096 tokens."""
    from tfcompile.evaluate.kvtext import LENS_MAX_POSITIONS, LENS_MIN_POSITIONS, LENS_WORK_SHARE
    from tfcompile.evaluate.lens import lens_positions, spread

    head, linears = 49152 * 576, 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    plain, lens = 2 * (linears + head), 2 * 29 * head
    assert lens_positions(LENS_MIN_POSITIONS, plain, lens) == LENS_MIN_POSITIONS  # all of a short eval
    n = lens_positions(4096, plain, lens)
    assert LENS_MIN_POSITIONS < n < LENS_MAX_POSITIONS
    assert n * lens <= LENS_WORK_SHARE * plain * 4096 < (n + 1) * lens
    assert lens_positions(1 << 20, plain, lens) == LENS_MAX_POSITIONS
    assert lens_positions(4096, plain, 1) == LENS_MAX_POSITIONS  # a small vocabulary: the cap
    assert lens_positions(4096, 1, lens) == LENS_MIN_POSITIONS  # the floor
    assert spread(7, 7).tolist() == list(range(7)) and spread(4096, n).tolist() == _lens_picks(4096, n)


@pytest.mark.parametrize("eps,rel", [(1e-1, 1e-5), (1e-2, 1e-4), (1e-3, 1e-3)])
def test_row_kl_matches_float64_log_softmaxes(eps, rel):
    """The lens's in-place KL (E_p[g(d)] + log1p(y) - y) against float64 log-softmaxes, on logits of
    SmolLM2's vocabulary size, down to KL ~5e-7 per row (where float32 log-softmaxes, the formula it
    replaced, were off by more than 100%)."""
    from tfcompile.evaluate.lens import row_kl

    g = torch.Generator().manual_seed(0)
    zr = 3 * torch.randn(16, 49152, generator=g)
    zc = zr + eps * torch.randn(zr.shape, generator=g)
    lr, lc = F.log_softmax(zr.double(), -1), F.log_softmax(zc.double(), -1)
    want = (lr.exp() * (lr - lc)).sum(-1)
    got = row_kl(zr.clone(), zc.clone())
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert got.tolist() == pytest.approx(want.tolist(), rel=rel)
