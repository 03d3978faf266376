"""Fixtures for tests/draft: the demo LM as target, held-out prompts, a tiny trained draft, tiny DeepSeek-V3
checkpoints with an MTP layer (random, and an oracle whose MTP layer is the target itself) and their artifacts."""

from __future__ import annotations

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
@pytest.fixture(scope="session")
def mtp_random(family_factory, tmp_path_factory) -> Path:
    """4 decoder layers (2 dense, 2 MoE) + one MTP layer in the published layout (`model.layers.4.*`),
    random: a perturbed copy of layer 3 and random eh_proj / shared_head (tests/fixtures/families.py)."""
    src = family_factory.make_tiny_deepseek_v3(tmp_path_factory.mktemp("mtp") / "random", topk_method="noaux_tc")
    return family_factory.add_mtp_layer(src)


@pytest.fixture(scope="session")
def mtp_oracle(family_factory, tmp_path_factory) -> Path:
    """A one-layer DeepSeek-V3 whose MTP layer is the target itself, shifted one position: a
    constructed MTP head that predicts the target well (tests/fixtures/families.make_mtp_oracle)."""
    return family_factory.make_mtp_oracle(tmp_path_factory.mktemp("mtp") / "oracle")


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


@pytest.fixture(scope="session")
def mtp_matches_by_hand():
    """check(src, model, seq, step0, chain): tfcompile's MTP layer of checkpoint `src` on target
    `model` gives, for the token sequence `seq`, the logits an independent computation from the raw
    tensors gave: `step0` (every position of the first step) and `chain` (the drafter's second
    step, fed its own first draft); and the drafter proposes their argmaxes."""
    def check(src, model, seq: list[int], step0: torch.Tensor, chain: torch.Tensor) -> None:
        from tfcompile.draft.mtp import TARGET_HIDDEN, MTPDrafter
        from tfcompile.draft.mtp_load import load_mtp
        from tfcompile.draft.spec import Target

        layer = load_mtp(src, model)
        with torch.no_grad():
            t = Target(model, TARGET_HIDDEN)
            t.reset()
            _, aux = t.forward(seq[:-1])
            ours = layer.logits(layer.step(torch.tensor([seq[1:]]), aux[None], torch.arange(len(seq) - 1), None))[0]
        torch.testing.assert_close(ours, step0, rtol=1e-4, atol=1e-4)
        d = MTPDrafter(layer)
        d.begin(seq[:-1], aux)
        drafted = d.propose(seq, 2)
        torch.testing.assert_close(d.logits[0], step0[-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(d.logits[1], chain, rtol=1e-4, atol=1e-4)
        assert drafted == [int(step0[-1].argmax()), int(chain.argmax())]
        assert not torch.allclose(chain, step0[-1], atol=1e-2)  # the chained step is a different computation

    return check
