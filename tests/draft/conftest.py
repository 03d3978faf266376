"""Fixtures for tests/draft: the demo LM as target, held-out prompts, a tiny trained draft, tiny DeepSeek-V3
checkpoints with an MTP layer (random, and an oracle whose MTP layer is the target itself) and their artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
# A tiny draft of the demo LM: seconds of training on 2 cores (docs/accuracy.md has the real runs).
TINY = dict(steps=40, batch=4, seq_len=64, text_blocks=32, self_blocks=32, self_prompt=16, lr=1e-2, warmup=5,
            log_every=10)


@pytest.fixture(scope="session")
def demo_target():
    from tfcompile.evaluate.models import load_checkpoint_model

    return load_checkpoint_model(DEMO, torch.float32, "reference")


@pytest.fixture(scope="session")
def demo_prompts():
    """Eight 32-token prompts of python-doc's held-out split (never the training text)."""
    from tfcompile.draft.acceptance import prompts_of
    from tfcompile.evaluate.text import load_tokenizer

    return prompts_of(None, load_tokenizer(DEMO), count=8, prompt_len=32, vocab=4096)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    """A draft trained on the demo LM by `tfcompile draft` (library entry point)."""
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import run_draft

    out = tmp_path_factory.mktemp("draft") / "demo-eagle3"
    run_draft(DEMO, out, DraftConfig(**TINY))
    return out


# --- MTP (draft/mtp.py): tiny DeepSeek-V3 checkpoints with one MTP layer ---------------------------
EMBED_RMS = 0.08  # every embedding row of the oracle target is scaled to this RMS


@pytest.fixture(scope="session")
def mtp_random(family_factory, tmp_path_factory) -> Path:
    """4 decoder layers (2 dense, 2 MoE) + one MTP layer in the published layout (`model.layers.4.*`),
    random: a perturbed copy of layer 3 and random eh_proj / shared_head (tests/fixtures/families.py)."""
    src = family_factory.make_tiny_deepseek_v3(tmp_path_factory.mktemp("mtp") / "random", topk_method="noaux_tc")
    return family_factory.add_mtp_layer(src)


@pytest.fixture(scope="session")
def mtp_oracle(family_factory, tmp_path_factory) -> Path:
    """A one-layer (MoE) DeepSeek-V3 whose MTP layer *is* the target, shifted one position: its block
    is layer 0 copied, eh_proj = [r I, 0] so eh_proj(cat(enorm(e), hnorm(h))) = r e / rms(e) = e (every
    embedding row has RMS r), shared_head = the final norm and lm_head. At index i it reads tokens
    x[1..i+1] as the target reads x[0..i+1] (RoPE is relative: only x[0] is missing), so it predicts
    the target's own next token well: a constructed "trained" MTP head."""
    from safetensors.torch import load_file, save_file

    src = family_factory.make_tiny_deepseek_v3(tmp_path_factory.mktemp("mtp") / "oracle", layers=1, dense=0,
                                               topk_method="noaux_tc")
    t = load_file(str(src / "model.safetensors"))
    e = t["model.embed_tokens.weight"].float()
    rms = e.pow(2).mean(-1, keepdim=True).sqrt()  # the padding row is zero: it stays zero
    t["model.embed_tokens.weight"] = torch.where(rms > 0, e * EMBED_RMS / rms.clamp_min(1e-12), e).to(torch.bfloat16)
    h = e.shape[1]
    for name in [n for n in t if n.startswith("model.layers.0.")]:
        t["model.layers.1." + name[len("model.layers.0."):]] = t[name].clone()
    ones = torch.ones(h, dtype=torch.bfloat16)
    eh = torch.cat([EMBED_RMS * torch.eye(h), torch.zeros(h, h)], 1).to(torch.bfloat16)  # [H, 2H]
    t.update({"model.layers.1.enorm.weight": ones, "model.layers.1.hnorm.weight": ones.clone(),
              "model.layers.1.eh_proj.weight": eh,
              "model.layers.1.shared_head.norm.weight": t["model.norm.weight"].clone(),
              "model.layers.1.shared_head.head.weight": t["lm_head.weight"].clone(),
              "model.layers.1.embed_tokens.weight": t["model.embed_tokens.weight"].clone()})
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=1), indent=2))
    return src


def quantized(src: Path, out: Path, fmt: str) -> Path:
    """`tfcompile quantize SRC -o OUT --format FMT` in-process (random calibration for static formats)."""
    from tfcompile.cli.main import main

    calib = ["--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32"] if fmt == "nvfp4" else []
    assert main(["quantize", str(src), "-o", str(out), "--format", fmt, "-q", *calib]) == 0
    return out


@pytest.fixture(scope="session")
def mtp_oracle_fp8(mtp_oracle, tmp_path_factory) -> Path:
    return quantized(mtp_oracle, tmp_path_factory.mktemp("mtp") / "oracle-fp8", "fp8-dynamic")


@pytest.fixture(scope="session")
def mtp_oracle_nvfp4(mtp_oracle, tmp_path_factory) -> Path:
    """W4A4 with calibrated input scales: the MTP block's activation quantization emulated, experts included."""
    return quantized(mtp_oracle, tmp_path_factory.mktemp("mtp") / "oracle-nvfp4", "nvfp4")
