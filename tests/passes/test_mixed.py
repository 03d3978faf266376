"""Mixed precision (passes/mixed.py, tfcompile/mixed/).

- search: the greedy choice meets the bits budget, spends it where KL per bit is highest, and
  reaches a KL budget with the fewest bits;
- sensitivity: replaying the layers before a group gives the same KL as a full forward, and an
  unchanged model costs nothing;
- the artifact: several compressed-tensors config groups with explicit targets, verify checks
  them (and catches a wrong one), and transformers + compressed-tensors loads it with logits
  equal to tfcompile's own dequantized model; "bf16" groups are left unquantized.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tfcompile.mixed.search import GroupCost, choose, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from interop_util import load_reference_model, quant_config, read_tensors  # noqa: E402

SENS = ("--set", "mixed.samples=1", "--set", "mixed.seq_len=32", "--set", "mixed.data=random")


def _costs():
    # (key, params, KL in nvfp4a16, KL in fp8-dynamic)
    spec = [("a", 100, 0.50, 0.01), ("b", 100, 0.10, 0.01), ("c", 400, 0.60, 0.02), ("d", 100, 0.02, 0.0)]
    return [GroupCost(k, p, {"nvfp4a16": lo, "fp8-dynamic": hi, "bf16": 0.0}) for k, p, lo, hi in spec]


def test_choose_meets_the_bits_budget_where_it_saves_most():
    costs = _costs()
    assert choose(costs, "nvfp4a16", avg_bits=4.5) == {c.key: "nvfp4a16" for c in costs}
    pick = choose(costs, "nvfp4a16", avg_bits=5.3)  # 0.8 bits x 700 weights = 560 extra bit-weights
    assert pick["a"] == "fp8-dynamic"  # 0.49 saved per 350 bit-weights, the best ratio
    s = summary(costs, pick)
    assert s["avg_bits"] <= 5.3 and s["predicted_kl"] == pytest.approx(0.01 + 0.10 + 0.60 + 0.02)
    everything = choose(costs, "nvfp4a16", avg_bits=16)
    assert everything == {"a": "bf16", "b": "bf16", "c": "bf16", "d": "fp8-dynamic"}  # no bits for nothing


def test_choose_reaches_a_kl_budget_with_the_fewest_bits():
    costs = _costs()
    pick = choose(costs, "nvfp4a16", max_kl=0.2)
    s = summary(costs, pick)
    assert s["predicted_kl"] <= 0.2
    assert pick["d"] == "nvfp4a16" and pick["b"] == "nvfp4a16"  # not needed
    with pytest.raises(ValueError):
        choose(costs, "nvfp4a16")


def test_replay_equals_a_full_forward(tiny_llama_src):
    from transformers import AutoModelForCausalLM

    from tfcompile.mixed.sensitivity import Runner

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_src, dtype=torch.float32).eval()
    ids = torch.randint(4, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    run = Runner(model, ids)
    assert run.kl(0) == 0 and run.kl(1) == 0
    layer = model.model.layers[1].mlp.down_proj
    with torch.no_grad():
        layer.weight.mul_(1.5)
    assert run.kl(1) == pytest.approx(run.kl(0), rel=1e-5) and run.kl(0) > 0
    assert run.layer_of("model.layers.1.mlp.down_proj") == 1


@pytest.fixture(scope="module")
def mixed_artifact(tiny_llama_src, tmp_path_factory):
    import contextlib
    import io

    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("mixed") / "out"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = main(["quantize", str(tiny_llama_src), "-o", str(out), "--format", "nvfp4a16", "--set",
                     "mixed.avg_bits=6.0", "--json", "-q", *SENS])
    assert code == 0
    return out, json.loads(buf.getvalue())


def test_artifact_holds_one_config_group_per_format(mixed_artifact):
    out, doc = mixed_artifact
    qc = quant_config(out)
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    mixed = manifest["mixed"]
    assert mixed["avg_bits"] <= 6.0 and mixed["base"] == "nvfp4a16"
    assert set(mixed["groups_per_format"]) == {"nvfp4a16", "fp8-dynamic"}  # the budget buys some upgrades
    assert qc["format"] == "mixed-precision" and len(qc["config_groups"]) == 2
    by_format = {g["format"]: set(g["targets"]) for g in qc["config_groups"].values()}
    layers = {x["module"]: x["format"] for x in manifest["layers"]}
    assert by_format["nvfp4-pack-quantized"] == {m for m, f in layers.items() if f == "nvfp4a16"}
    assert by_format["float-quantized"] == {m for m, f in layers.items() if f == "fp8-dynamic"}
    for key, fmt in mixed["groups"].items():  # fused groups share one format
        assert {layers[m] for m in layers if m.startswith(key.rsplit(".", 1)[0] + ".")
                and _role(m) == key.rsplit(".", 1)[1]} <= {fmt}
    t = read_tensors(out)
    assert all(f"{m}.weight_packed" in t for m, f in layers.items() if f == "nvfp4a16")
    assert all(t[f"{m}.weight"].dtype == torch.float8_e4m3fn for m, f in layers.items() if f == "fp8-dynamic")


def _role(module: str) -> str:
    leaf = module.rsplit(".", 1)[1]
    return {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}.get(leaf, leaf)


def test_verify_checks_the_config_groups(mixed_artifact, tmp_path, run_cli):
    import shutil

    out, _ = mixed_artifact
    res = run_cli("verify", out, "--json")
    assert res.code == 0 and any(c["check"] == "mixed-precision config groups" and c["ok"] for c in res.json()["checks"])
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    groups = cfg["quantization_config"]["config_groups"]
    a, b = list(groups)
    groups[a]["targets"], groups[b]["targets"] = groups[b]["targets"], groups[a]["targets"]
    (bad / "config.json").write_text(json.dumps(cfg))  # swapped targets: every layer in the wrong group
    res = run_cli("verify", bad, "--json")
    assert res.code == 1
    failed = {c["check"] for c in res.json()["checks"] if not c["ok"]}
    assert failed == {"checksums", "mixed-precision config groups"}, failed


def test_transformers_loads_the_mixed_artifact_with_our_logits(mixed_artifact, tiny_llama_src):
    """transformers + compressed-tensors' default load (each module decompressed with its own
    config group's format, as vLLM also reads per-module schemes) gives exactly tfcompile's
    dequantized weights, and with compressed-tensors' activation QDQ off exactly our logits.
    (transformers 5.24's `CompressedTensorsConfig(dequantize=True)` path picks one config group
    for every dense module, so it cannot load a dense mixed model: docs/interop.md.)"""
    from transformers import AutoModelForCausalLM

    out, _ = mixed_artifact
    ids = torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    ours, mods = load_reference_model(tiny_llama_src, out)
    assert len(mods) == 14
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16).eval()
    formats = {n: m.quantization_scheme.format.value for n, m in model.named_modules()
               if hasattr(m, "quantization_scheme")}
    assert set(formats.values()) == {"nvfp4-pack-quantized", "float-quantized"}
    with torch.no_grad():
        with_qdq = model(ids).logits  # fp8-dynamic groups also quantize their inputs per token
        for m in model.modules():
            if hasattr(m, "quantization_scheme"):
                m.quantization_enabled = False
        got = model(ids).logits
        want = ours(ids).logits
    named = dict(model.named_modules())
    for name, w in zip(mods, [dict(ours.named_modules())[n].weight for n in mods]):
        assert torch.equal(named[name].weight, w), name
    assert torch.equal(got, want)
    assert not torch.equal(with_qdq, want) and float((with_qdq.float() - want.float()).abs().max()) < 0.5


def test_bf16_groups_are_left_unquantized(tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16", "--set", "mixed.avg_bits=8",
                  "--set", 'mixed.formats=["bf16"]', "--json", "-q", *SENS)
    assert res.code == 0, res.err
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    kept = [k for k, f in manifest["mixed"]["groups"].items() if f == "bf16"]
    assert kept and manifest["mixed"]["avg_bits"] <= 8
    qc = quant_config(out)
    t = read_tensors(out)
    layer_modules = {x["module"] for x in manifest["layers"]}
    for name in qc["ignore"]:
        if name.startswith("model.layers."):
            assert name not in layer_modules and t[f"{name}.weight"].dtype == torch.bfloat16
    assert run_cli("verify", out).code == 0


def test_bad_budgets_are_refused(run_cli):
    res = run_cli("plan", "--format", "nvfp4a16", "--set", "mixed.formats=[\"fp8-dynamic\"]")
    assert res.code == 1 and "one budget" in res.err and "hint:" in res.err
    res = run_cli("plan", "--format", "fp8-dynamic", "--set", "mixed.avg_bits=8", "--set", 'mixed.formats=["nvfp4a16"]')
    assert res.code == 1 and "not more bits" in res.err
    res = run_cli("plan", "--format", "nvfp4a16", "--set", "mixed.avg_bits=6", "--export", "modelopt")
    assert res.code == 1 and "cannot be combined" in res.err


def test_sensitivity_is_measured_once_per_model_and_settings(tiny_llama_src, tmp_path, monkeypatch, run_cli):
    """A second budget reuses the measured sensitivities; the artifact is the same bytes either way."""
    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path / "cache"))
    runs = []
    for i, bits in enumerate(("6.0", "5.0", "6.0")):
        res = run_cli("quantize", tiny_llama_src, "-o", tmp_path / f"o{i}", "--format", "nvfp4a16", "--set",
                      f"mixed.avg_bits={bits}", "--json", "-q", *SENS)
        assert res.code == 0, res.err
        runs.append(res.json()["passes"]["mixed"])
    assert [r["sensitivity_cached"] for r in runs] == [False, True, True]
    assert runs[1]["avg_bits"] < runs[0]["avg_bits"]
    for f in sorted(p.relative_to(tmp_path / "o0") for p in (tmp_path / "o0").rglob("*") if p.is_file()):
        assert (tmp_path / "o0" / f).read_bytes() == (tmp_path / "o2" / f).read_bytes(), f


def _ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    for rank, i in enumerate(order):
        r[i] = float(rank)
    return torch.tensor(r)


def test_fisher_sensitivity_ranks_groups_as_the_measured_kl_does(tmp_path, run_cli):
    """The default one-backward estimate (mixed/fisher.py) against the exact measurement (a forward
    per group and format with that group alone quantized, mixed/sensitivity.py) on the trained demo
    LM: the groups' costs rank alike (Spearman >= 0.85 per format) and fp8-dynamic costs less than
    nvfp4a16 for every group."""
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
    kl = {}
    for m in ("kl", "fisher"):
        out = tmp_path / m
        res = run_cli("quantize", demo, "-o", out, "--format", "nvfp4a16", "--set", "mixed.avg_bits=6", "-q",
                      "--set", f"mixed.sensitivity={m}", "--set", "mixed.data=python-doc", "--set",
                      "mixed.samples=1", "--set", "mixed.seq_len=256", "--set", "mixed.cache=false")
        assert res.code == 0, res.err
        kl[m] = json.loads((out / "tfcompile/manifest.json").read_text())["mixed"]["sensitivity"]["kl"]
    groups = sorted(kl["kl"])
    assert groups == sorted(kl["fisher"]) and len(groups) == 16
    for fmt in ("nvfp4a16", "fp8-dynamic"):
        a, b = _ranks([kl["kl"][g][fmt] for g in groups]), _ranks([kl["fisher"][g][fmt] for g in groups])
        rho = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        assert rho >= 0.85, (fmt, rho)
    assert all(0 < kl["fisher"][g]["fp8-dynamic"] < kl["fisher"][g]["nvfp4a16"] for g in groups)
