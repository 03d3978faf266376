"""AWQ: the norm fold is exact, the search never loses to RTN on its rows, the artifact
(with its folded norms) loads in transformers + compressed-tensors as tfcompile's own
dequantized model, unsupported formats are refused, and reruns are byte-identical."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from tfcompile.calibration.record import CALIB as CALIB_FACT
from tfcompile.calibration.awq_stats import AWQInput, awq_statistics, verify_folds
from tfcompile.errors import RecipeError
from tfcompile.ir import Job, OutSpec, Program, QuantTarget
from tfcompile.kernels import formats as F
from tfcompile.passes.quantize.awq import (GRID, awq_scales, check_scheme, fake_act, fold_norm,
                                           folded_amax, search)
from tfcompile.passes.quantize.rtn import quantize_weight
from tfcompile.schemes import SCHEMES, get_scheme

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from interop_util import our_dequantized_weights, read_tensors  # noqa: E402

CALIB = ("--calib", "random", "--calib-samples", "4", "--calib-seq-len", "32")
ALL_FORMATS = tuple(SCHEMES)
LAYERS = [(i, norm, [f"{blk}.{p}" for p in projs]) for i in range(2) for norm, blk, projs in (
    ("input_layernorm", "self_attn", ("q_proj", "k_proj", "v_proj")),
    ("post_attention_layernorm", "mlp", ("gate_proj", "up_proj")))]


def _model(path, dtype=torch.float32, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def test_fold_is_exact(tiny_llama_src, ids):
    """norm(x)/s @ (W*s)^T == norm(x) @ W^T: folding every norm of the tiny Llama (fp32)
    leaves its logits equal to fp32 rounding, with s spanning ~4 orders of magnitude."""
    model = _model(tiny_llama_src)
    with torch.no_grad():
        ref = model(ids).logits
        mods = dict(model.named_modules())
        g = torch.Generator().manual_seed(1)
        for i, norm, members in LAYERS:
            n = mods[f"model.layers.{i}.{norm}"]
            s = awq_scales(torch.rand(n.weight.shape[0], generator=g) ** 4 * 10, 0.8)
            assert float(s.max() / s.min()) > 1e3
            folded, eff = fold_norm(n.weight.detach(), s)
            assert torch.allclose(folded * eff, n.weight, rtol=1e-6, atol=0)
            n.weight.copy_(folded)
            for m in members:
                mods[f"model.layers.{i}.{m}"].weight.mul_(eff)
        out = model(ids).logits
    assert not torch.equal(out, ref)  # the weights did change ...
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4), (out - ref).abs().max()  # ... not the model


def test_fold_in_bf16_storage_is_exact_to_fp32_rounding():
    """A bf16 norm weight w / s is rounded, so s is replaced by s' = w / w': w' * s' == w."""
    g = torch.Generator().manual_seed(2)
    w = (torch.rand(256, generator=g) + 0.5).bfloat16()
    s = awq_scales(torch.rand(256, generator=g) * 5, 0.5)
    folded, eff = fold_norm(w, s)
    assert folded.dtype == torch.bfloat16
    assert torch.allclose(folded.float() * eff, w.float(), rtol=2e-7, atol=0)
    assert torch.allclose(eff, s, rtol=1e-2)  # bf16 rounding moves s by < 2^-8
    assert torch.equal(fold_norm(w, torch.ones(256))[0], w)  # alpha = 0: the norm is untouched


def test_folded_static_amax():
    st = AWQInput("n", torch.ones(4), torch.tensor([1.0, 8.0, 2.0, 4.0]), torch.zeros(0, 4), 0)
    s = torch.tensor([1.0, 4.0, 1.0, 1.0])
    assert folded_amax(8.0, st, s) == 4.0  # max_j(amax_j / s_j)
    assert folded_amax(6.0, st, s) == 3.0  # a clipping observer keeps its ratio (6/8)


def test_override_replaces_a_verbatim_copy_only():
    w = torch.ones(4, dtype=torch.bfloat16)
    copy = Job(None, "n.weight", (OutSpec("n.weight", torch.bfloat16, (4,)),))
    kv = Job(None, None, (OutSpec("a.k_scale", torch.bfloat16, (1,)),), const=torch.ones(1))
    prog = Program(get_scheme("nvfp4a16"), "awq", (copy, kv), {}, "floor", 16)
    out = prog.with_overrides({"n.weight": w * 2})
    assert [j.kind for j in out.jobs] == ["override", "const"] and [j.kind for j in prog.jobs] == ["copy", "const"]
    assert torch.equal(out.jobs[0].const, w * 2) and out.specs() == prog.specs()
    with pytest.raises(ValueError, match="does not match"):
        prog.with_overrides({"n.weight": w.float()})
    with pytest.raises(ValueError, match="no verbatim copy"):
        prog.with_overrides({"a.k_scale": torch.ones(1)})


def _group(seed=0, k=256, sizes=(192, 64), tokens=1024):
    """Two Linears sharing an input with a few outlier channels (as LLM activations have)."""
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(n, k, generator=g).bfloat16() for n in sizes]
    scale = torch.ones(k)
    scale[torch.randperm(k, generator=g)[:8]] = 20.0
    x = torch.randn(tokens, k, generator=g) * scale
    st = AWQInput("norm", x.abs().mean(0), x.abs().amax(0), x, tokens)
    members = tuple(QuantTarget(f"m{i}", f"m{i}.weight", None, None, tuple(w.shape)) for i, w in enumerate(ws))
    return ws, st, members


def _loss(fmt, ws, members, x, s, max_abs):
    """The output error recomputed from the kernels (independent of awq.group_loss)."""
    scheme = get_scheme(fmt)
    prog = Program(scheme, "awq", (), {}, "floor", 16)
    scaled = [w.float() * s for w in ws]
    gs = scheme.weights.group_global_scale(scaled)
    xq = fake_act(x / s, scheme, float((max_abs / s).max()), torch.bfloat16)
    total = 0.0
    for t, w, w0 in zip(members, scaled, ws):
        deq = F.dequantize(quantize_weight(w, prog, gs, t.source, torch.bfloat16))
        total += float((xq @ deq.T - x @ w0.float().T).double().pow(2).sum())
    return total


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_search_never_worse_than_rtn(fmt):
    ws, st, members = _group()
    scheme = get_scheme(fmt)
    prog = Program(scheme, "awq", (), {}, "floor", 16)
    norm_w = torch.ones(256, dtype=torch.bfloat16)
    fold, folded = search(st, norm_w, [w.float() for w in ws], members, prog, torch.bfloat16)
    assert fold.alpha in GRID and fold.loss <= fold.rtn_loss
    # alpha = 0 is exactly RTN, and the chosen alpha's loss is what the quantized group gives
    assert fold.rtn_loss == pytest.approx(_loss(fmt, ws, members, st.rows, torch.ones(256), st.max_abs), rel=1e-5)
    assert fold.loss == pytest.approx(_loss(fmt, ws, members, st.rows, fold.s, st.max_abs), rel=1e-5)
    assert torch.equal(folded, fold_norm(norm_w, awq_scales(st.mean_abs, fold.alpha))[0])
    if scheme.weight == "nvfp4":  # outlier channels: AWQ clearly helps NVFP4 (measured 0.30 of RTN)
        assert fold.alpha > 0 and fold.loss < 0.5 * fold.rtn_loss, (fold.alpha, fold.loss / fold.rtn_loss)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8"])
def test_search_on_the_reference_path_picks_what_the_fused_kernels_pick(fmt, monkeypatch):
    """The path a GPU takes (device tensors, the formats reference instead of the CPU's fused
    kernels, the activation scale built on x's device) gives the CPU path's fold exactly."""
    from tfcompile.kernels.formats import fast

    ws, st, members = _group(seed=1)
    prog = Program(get_scheme(fmt), "awq", (), {}, "floor", 16)
    norm_w = torch.ones(256, dtype=torch.bfloat16)
    args = (st, norm_w, [w.float() for w in ws], members, prog, torch.bfloat16)
    fused = search(*args, device="cpu")
    calls = []
    real = fast.available
    monkeypatch.setattr(fast, "available", lambda x: calls.append(x.device) or False)
    ref = search(*args, device=torch.device("cpu"))
    assert calls and real(st.rows)  # the reference really ran, where the fused kernels could have
    assert (ref[0].alpha, ref[0].loss, ref[0].rtn_loss) == (fused[0].alpha, fused[0].loss, fused[0].rtn_loss)
    assert torch.equal(ref[0].s, fused[0].s) and torch.equal(ref[1], fused[1])


def test_off_the_cpu_the_cpu_decides_among_the_near_best(monkeypatch):
    """Off the CPU, the device's losses only shortlist: alpha 0 and the alphas within TIE_RTOL
    of the least are re-scored on the CPU, whose scores pick and are reported. The "device" is
    the meta device with a stand-in scorer whose float error (1e-4, under TIE_RTOL) makes a
    worse alpha look best."""
    import tfcompile.passes.quantize.awq as awq

    ws, st, members = _group(seed=2)
    prog = Program(get_scheme("nvfp4a16"), "awq", (), {}, "floor", 16)
    norm_w = torch.ones(256, dtype=torch.bfloat16)
    args = (st, norm_w, [w.float() for w in ws], members, prog, torch.bfloat16)
    cpu_fold, cpu_folded = search(*args)
    real_scorer = awq.scorer
    exact = real_scorer(st, args[2], members, prog, torch.bfloat16, "cpu")
    true = {a: exact(*_cand(st, norm_w, a)) for a in GRID}
    best = cpu_fold.alpha
    rival = min((a for a in GRID if a != best), key=lambda a: true[a])
    scored = []

    def fake_scorer(st_, weights, members_, program, dtype, device):
        if torch.device(device).type == "cpu":
            cpu = real_scorer(st_, weights, members_, program, dtype, device)
            return lambda s, amax: scored.append(s) or cpu(s, amax)
        assert torch.device(device).type == "meta"
        alphas = {a: _cand(st, norm_w, a)[0] for a in GRID}

        def on_device(s, amax):
            a = next(a for a, sa in alphas.items() if torch.equal(sa, s))
            return {best: true[best], rival: true[best] * (1 - 1e-4)}.get(a, true[a] * 1.01)
        return on_device

    monkeypatch.setattr(awq, "scorer", fake_scorer)
    fold, folded = search(*args, device="meta")
    assert (fold.alpha, fold.loss, fold.rtn_loss) == (cpu_fold.alpha, cpu_fold.loss, cpu_fold.rtn_loss)
    assert torch.equal(fold.s, cpu_fold.s) and torch.equal(folded, cpu_folded)
    assert len(scored) == len({0.0, rival, best})  # only the shortlist (and alpha 0) ran on the CPU
    monkeypatch.setattr(awq, "TIE_RTOL", 1e-5)  # a device error above TIE_RTOL is not caught
    assert search(*args, device="meta")[0].alpha == rival


def _cand(st, norm_w, alpha):
    """(s', static amax) of one alpha, as search() builds it."""
    s = fold_norm(norm_w, awq_scales(st.mean_abs, alpha))[1]
    return s, folded_amax(float(st.max_abs.max()), st, s)


def test_unsupported_format_is_refused(monkeypatch, run_cli):
    fake = dataclasses.replace(get_scheme("fp8-dynamic"), name="int8", weight="int8")
    with pytest.raises(RecipeError) as e:
        check_scheme(fake)
    assert "awq" in e.value.message and "NVFP4" in e.value.hint
    monkeypatch.setitem(SCHEMES, "int8", fake)
    res = run_cli("plan", "--format", "int8", "--algorithm", "awq")
    assert res.code == 1
    assert "does not support format 'int8'" in res.err and "hint:" in res.err
    assert run_cli("plan", "--format", "int8").code == 0  # RTN is fine with it


def test_plan_schedules_awq_statistics(run_cli):
    plan = run_cli("plan", "--format", "mxfp4a16", "--algorithm", "awq").json()
    cal = next(p for p in plan["passes"] if p["name"] == "calibrate")
    assert cal["config"]["awq"] is True and cal["config"]["hessian"] is False


def test_awq_without_statistics_is_an_error(tiny_llama, tmp_path, run_cli):
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "o", "--format", "nvfp4a16",
                  "--algorithm", "awq", "--skip", "calibrate")
    assert res.code == 1 and "awq needs activation statistics" in res.err and "hint:" in res.err


def test_fold_check_rejects_a_norm_that_is_not_plain(tiny_llama_src):
    """A Gemma-style norm n(x) * (1 + w) does not fold by dividing w: the check sees it."""
    model = _model(tiny_llama_src, torch.bfloat16)
    ids = torch.randint(4, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    folds = {f"{i}.{norm}": (f"model.layers.{i}.{norm}", [f"model.layers.{i}.{m}" for m in ms])
             for i, norm, ms in LAYERS}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert verify_folds(model, ids, folds) == {}
    norm = model.model.layers[1].input_layernorm

    def gemma(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight.float())).to(x.dtype)

    norm.forward = types.MethodType(gemma, norm)
    bad = verify_folds(model, ids, folds)
    assert list(bad) == ["1.input_layernorm"] and "changes the model's output" in bad["1.input_layernorm"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # restored bit for bit


@pytest.fixture(scope="module")
def awq_artifact(tiny_llama_src, tmp_path_factory):
    """tiny Llama -> nvfp4a16 with AWQ, both views; (path, --json document)."""
    import contextlib
    import io

    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("awq") / "nvfp4a16"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", "nvfp4a16",
                     "--algorithm", "awq", "--export", "modelopt", "--json", "-q", *CALIB])
    assert code == 0
    return out, json.loads(buf.getvalue())


def test_artifact_records_awq(awq_artifact):
    out, doc = awq_artifact
    assert doc["passes"]["calibrate"]["awq_groups"] == 4  # 2 layers x (qkv, gate_up)
    layers = {x["module"]: x for x in json.loads((out / "tfcompile/manifest.json").read_text())["layers"]}
    for name, x in layers.items():
        if name.endswith(("o_proj", "down_proj")):  # input not a norm output: RTN, and why
            assert x["algorithm"] == "rtn" and x["awq_skipped"] == "input is not a norm output"
        else:
            assert x["algorithm"] == "awq" and x["awq_alpha"] in GRID and x["awq_loss_vs_rtn"] <= 1
    assert any(x.get("awq_alpha", 0) > 0 for x in layers.values())


def test_artifact_loads_in_transformers_with_folded_norms(awq_artifact, tiny_llama_src, ids):
    """transformers + compressed-tensors (dequantize=True) == the original model with the
    artifact's norms and tfcompile's dequantized weights, bit for bit."""
    from transformers import CompressedTensorsConfig

    out, doc = awq_artifact
    stored, src = read_tensors(out), read_tensors(tiny_llama_src)
    alphas = {x["awq_norm"]: x["awq_alpha"] for x in doc["layers"] if x["algorithm"] == "awq"}
    for norm, alpha in alphas.items():  # folded exactly where alpha > 0
        assert torch.equal(stored[f"{norm}.weight"], src[f"{norm}.weight"]) == (alpha == 0), norm
    assert torch.equal(stored["model.norm.weight"], src["model.norm.weight"])
    mo = read_tensors(out / "modelopt")  # the modelopt view carries the same folded norms
    assert all(torch.equal(mo[f"{n}.weight"], stored[f"{n}.weight"]) for n in alphas)

    ref = _model(tiny_llama_src, torch.bfloat16)
    sd = ref.state_dict()
    with torch.no_grad():
        for name, t in stored.items():
            if name in sd:
                sd[name].copy_(t)  # passthrough tensors, folded norms included
        mods = dict(ref.named_modules())
        for name, w in our_dequantized_weights(out).items():
            mods[name].weight.copy_(w)
        want = ref(ids).logits
    model = _model(out, torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        got = model(ids).logits
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()


def test_static_input_scale_is_the_folded_amax_and_reruns_are_identical(tiny_llama_src, tmp_path, run_cli):
    """nvfp4 (W4A4): a folded group's input_global_scale is 2688 / max_j(amax_j / s_j);
    a second run writes the same bytes."""
    from tfcompile.api import quantize

    opts = dict(overrides={"quantize": {"algorithm": "awq"},
                           "calibrate": {"data": "random", "samples": 4, "seq_len": 32}})
    ctx = quantize(tiny_llama_src, tmp_path / "a", "nvfp4", **opts)
    t = read_tensors(tmp_path / "a")
    assert ctx.program.prepared  # some group was folded
    for key, fold in ctx.program.prepared.items():
        st = awq_statistics(ctx[CALIB_FACT]).inputs[key]
        want = F.nvfp4_global_scale(torch.tensor([float((st.max_abs / fold.s).max())]))
        for m in (x.module for g in ctx.plan.groups if g.key == key for x in g.members):
            assert torch.equal(t[f"{m}.input_global_scale"], want), m
    quantize(tiny_llama_src, tmp_path / "b", "nvfp4", **opts)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert run_cli("verify", tmp_path / "a").code == 0


def test_moe_experts_stay_rtn_and_say_why(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    res = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "mxfp4a16", "--algorithm", "awq",
                  "--json", "-q", *CALIB)
    assert res.code == 0, res.err
    for x in res.json()["layers"]:
        if ".experts." in x["module"] and not x["module"].endswith("down_proj"):
            assert x["algorithm"] == "rtn" and x["awq_skipped"].startswith("MoE expert"), x
        elif x["module"].endswith(("q_proj", "k_proj", "v_proj")):
            assert x["algorithm"] == "awq", x
