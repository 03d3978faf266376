"""Issue 16, case 3: a checkpoint that does not match its architecture is refused before any
pass runs (exit 1 naming the tensor or config key), with or without calibration, and verify
catches an artifact that lost a tensor; absurd config values fail fast without allocating."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from safety_helpers import assert_clean_failure

WEIGHTS = "model.safetensors"
L0 = "model.layers.0"


def _edit_weights(model: Path, fn) -> None:
    sd = load_file(model / WEIGHTS)
    fn(sd)
    save_file(sd, model / WEIGHTS, metadata={"format": "pt"})


def _edit_config(model: Path, **changes) -> None:
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(changes)
    (model / "config.json").write_text(json.dumps(cfg))


def _drop(*names):
    def fn(sd):
        for n in [k for k in sd if any(k == x or k.startswith(x + ".") for x in names)]:
            del sd[n]
    return fn


BROKEN = {
    # name: (edit(model dir), text the error must contain)
    "missing decoder layer": (lambda m: _edit_weights(m, _drop("model.layers.1")), "model.layers.1."),
    "missing projection": (lambda m: _edit_weights(m, _drop(f"{L0}.self_attn.k_proj.weight")),
                           f"{L0}.self_attn.k_proj.weight"),
    "missing lm_head (untied)": (lambda m: _edit_weights(m, _drop("lm_head.weight")), "lm_head.weight"),
    "missing norm": (lambda m: _edit_weights(m, _drop("model.norm.weight")), "model.norm.weight"),
    "3-D up_proj": (lambda m: _edit_weights(m, lambda sd: sd.__setitem__(
        f"{L0}.mlp.up_proj.weight", sd[f"{L0}.mlp.up_proj.weight"].reshape(2, 128, 128))), f"{L0}.mlp.up_proj.weight"),
    "shape vs config": (lambda m: _edit_weights(m, lambda sd: sd.__setitem__(
        f"{L0}.mlp.down_proj.weight", sd[f"{L0}.mlp.down_proj.weight"][:, :128].contiguous())),
        f"{L0}.mlp.down_proj.weight"),
    "int8 norm": (lambda m: _edit_weights(m, lambda sd: sd.__setitem__(
        "model.norm.weight", sd["model.norm.weight"].to(torch.int8))), "model.norm.weight"),
    "unexpected extra tensor": (lambda m: _edit_weights(m, lambda sd: sd.__setitem__(
        f"{L0}.mlp.extra_proj.weight", torch.zeros(256, 128, dtype=torch.bfloat16))),
        f"{L0}.mlp.extra_proj.weight"),  # a Linear the model does not have: loaders would drop it
    "config: fewer layers than the checkpoint": (lambda m: _edit_config(m, num_hidden_layers=1),
                                                 "model.layers.1."),
    "config: wrong intermediate_size": (lambda m: _edit_config(m, intermediate_size=512), "up_proj"),
    "config: negative": (lambda m: _edit_config(m, num_attention_heads=-4), "num_attention_heads"),
    "config: string": (lambda m: _edit_config(m, hidden_size="128"), "hidden_size"),
    "config: absurd": (lambda m: _edit_config(m, num_hidden_layers=1_000_000_000), "num_hidden_layers"),
    "config: heads not dividing kv heads": (lambda m: _edit_config(m, num_key_value_heads=3),
                                            "num_key_value_heads"),
    "config: float layers": (lambda m: _edit_config(m, num_hidden_layers=2.5), "num_hidden_layers"),
    "config: architectures not strings": (lambda m: _edit_config(m, architectures=[5]), "architectures"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("fmt", ["nvfp4a16", "nvfp4"])  # weight-only, and with calibration
def test_broken_checkpoint_refused(case, fmt, tiny_llama, tmp_path, run_cli):
    edit, needle = BROKEN[case]
    edit(tiny_llama)
    out = tmp_path / "out"
    calib = ["--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16"] if fmt == "nvfp4" else []
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", fmt, *calib)
    assert_clean_failure(res, out, needle)
    assert "randomly" not in res.err and "warning" not in res.err.lower()


def test_checkpoint_errors_name_every_problem_briefly(tiny_llama, tmp_path, run_cli):
    _edit_weights(tiny_llama, _drop("model.layers.1"))
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "nvfp4a16")
    assert res.code == 1
    assert "missing" in res.err and "9 parameters" in res.err  # one layer: 7 Linears + 2 norms
    assert len(res.err) < 2000  # a summary, not one line per tensor of a 70B model


def test_absurd_config_fails_fast_without_allocating(tiny_llama, tmp_path):
    """num_hidden_layers = 1e9 once grew verify to 11.5 GB: now both commands fail in bounded memory."""
    _edit_config(tiny_llama, num_hidden_layers=1_000_000_000)
    script = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        from tfcompile.cli.main import main
        sys.exit(main(sys.argv[1:]))
    """)
    res = subprocess.run([sys.executable, "-c", script, "quantize", str(tiny_llama), "-o", str(tmp_path / "o"),
                          "--format", "nvfp4a16"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "num_hidden_layers" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_verify_refuses_absurd_config_in_artifact(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = 1_000_000_000
    (out / "config.json").write_text(json.dumps(cfg))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = run_cli("verify", out)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "num_hidden_layers" in res.err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 1 << 20  # KiB: < 1 GiB more


def test_verify_detects_artifact_missing_a_tensor(tiny_llama, tmp_path, run_cli):
    """An artifact whose norm was dropped (manifest re-hashed to match) fails `complete vs config`."""
    import hashlib

    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    _edit_weights(out, _drop("model.norm.weight"))
    mpath = out / "tfcompile" / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["files"][WEIGHTS] = hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()
    from tfcompile.artifact.manifest import write_manifest

    write_manifest(out, doc)
    res = run_cli("verify", out, "--json")
    assert res.code == 1
    failed = {c["check"]: c["detail"] for c in res.json()["checks"] if not c["ok"]}
    assert "model.norm.weight" in failed.get("complete vs config", ""), failed


def test_tied_embeddings_need_no_lm_head(model_factory, tmp_path, run_cli):
    """Tying is what the model declares: a tied checkpoint without lm_head.weight is complete."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    src = tmp_path / "tied"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(src)
    assert "lm_head.weight" not in load_file(src / WEIGHTS)
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
    assert res.code == 0, res.err
    assert run_cli("verify", out).code == 0


def test_old_rotary_inv_freq_buffers_are_accepted(tiny_llama, tmp_path, run_cli):
    """Older checkpoints persisted rotary inv_freq per layer; transformers declares them ignorable."""
    _edit_weights(tiny_llama, lambda sd: sd.__setitem__(f"{L0}.self_attn.rotary_emb.inv_freq",
                                                        torch.ones(16, dtype=torch.float32)))
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "nvfp4a16")
    assert res.code == 0, res.err


def test_moe_per_expert_checkpoint_missing_an_expert_refused(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    _edit_weights(src, _drop("model.layers.1.mlp.experts.2.up_proj.weight"))
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
    assert_clean_failure(res, out, "model.layers.1.mlp.experts")


def test_moe_fused_checkpoint_wrong_expert_count_refused(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    sd["model.layers.0.mlp.experts.down_proj"] = sd["model.layers.0.mlp.experts.down_proj"][:3].contiguous()
    save_file(sd, src / WEIGHTS, metadata={"format": "pt"})
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
    assert_clean_failure(res, out, "model.layers.0.mlp.experts.down_proj")


# ---- an architecture transformers does not know

def _unknown_arch(model: Path) -> None:
    _edit_config(model, architectures=["FrobnicatorForCausalLM"], model_type="frobnicator")


def test_unknown_architecture_needs_the_explicit_option(tiny_llama, tmp_path, run_cli):
    _unknown_arch(tiny_llama)
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    assert_clean_failure(res, out, "FrobnicatorForCausalLM", "--allow-unknown-architecture")


def test_unknown_architecture_with_the_option_states_the_consequences(tiny_llama, tmp_path, run_cli):
    _unknown_arch(tiny_llama)
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--allow-unknown-architecture",
                  "--json")
    assert res.code == 0, res.err
    warnings = " ".join(res.json()["warnings"])
    assert "not checked" in warnings and "FrobnicatorForCausalLM" in warnings
    assert json.loads((out / "tfcompile" / "manifest.json").read_text())["recipe"]["passes"][0] == {
        "name": "load", "config": {"allow_unknown_architecture": True}}


def test_direct_matching_when_transformers_lacks_its_loader_api(tiny_llama, monkeypatch):
    """A transformers without the v5 loader API: plain name matching still finds the problems."""
    from tfcompile import checkpoint_check as cc
    from tfcompile.io.checkpoint import open_checkpoint

    def gone(model, state):
        raise ImportError("no convert_and_load_state_dict_in_model")

    monkeypatch.setattr(cc, "_transformers_report", gone)
    ckpt = open_checkpoint(tiny_llama)
    tensors = cc.checkpoint_tensors(ckpt)
    model = cc.build_meta_model(ckpt.config, "x")
    assert not cc.find_problems(model, tensors)
    tensors.pop("model.norm.weight")
    tensors["model.extra.weight"] = (torch.bfloat16, (4,))
    tensors[f"{L0}.mlp.up_proj.weight"] = (torch.bfloat16, (2, 128, 128))
    p = cc.find_problems(cc.build_meta_model(ckpt.config, "x"), tensors)
    assert p.missing == ["model.norm.weight"] and p.unexpected == ["model.extra.weight"]
    assert p.mismatched == [f"{L0}.mlp.up_proj.weight: checkpoint [2, 128, 128], model [256, 128]"]
