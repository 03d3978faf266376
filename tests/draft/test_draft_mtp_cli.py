"""`tfcompile eval ART --reference SRC --draft mtp` end to end on the oracle DeepSeek-V3 (conftest).

The artifact's MTP acceptance is reported beside the reference's own MTP layer (`source`): a mild
format (fp8, dynamic activations) keeps most of it; `--min-acceptance` exits 1 on a miss; a model
without MTP layers, and one whose config declares an MTP layer it does not hold, are refused
before any evaluation, with a hint.
"""

from __future__ import annotations

import json
import shutil

DRAFT = ["--max-tokens", "128", "--no-layers", "--draft", "mtp", "--draft-k", "1,2", "--draft-prompts", "3",
         "--draft-prompt-len", "16", "--draft-new-tokens", "24", "--json"]


def test_fp8_artifact_keeps_the_mtp_acceptance_of_the_bf16_source(mtp_oracle, mtp_oracle_fp8, run_cli):
    res = run_cli("eval", mtp_oracle_fp8, "--reference", mtp_oracle, *DRAFT, "--min-acceptance", "10")
    assert res.code == 1, res.err  # the gate: 10 tokens per forward is out of reach at k = 1
    assert "--min-acceptance" in res.err and "hint:" in res.err
    doc = res.json()
    rep = doc["draft"]
    assert rep["drafter"] == "mtp" and rep["source"]["model"] == str(mtp_oracle)
    floor = {r["k"]: r["acceptance_length"] for r in rep["ngram_floor"]}
    for r in rep["by_k"]:
        assert r["source_acceptance_length"] > 1.4 and r["acceptance_length"] > floor[r["k"]], (r, floor)
        # fp8 moves this tiny random target's own tokens (its argmax margins are small), hence some drop;
        # a broken MTP head would sit at 1.0 (test_draft_mtp: the fp8 head does as well as the bf16 one)
        assert r["acceptance_length"] >= 0.75 * r["source_acceptance_length"], r
        assert r["acceptance_drop"] == round(r["source_acceptance_length"] - r["acceptance_length"], 4)
    assert doc["gates"][-1]["gate"] == "min-acceptance" and not doc["gates"][-1]["ok"]


def test_draft_mtp_on_a_model_without_mtp_layers_is_refused(run_cli):
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
    res = run_cli("eval", demo, "--reference", demo, *DRAFT)
    assert res.code == 1
    assert "declares no MTP layers (num_nextn_predict_layers is absent)" in res.err and "hint:" in res.err


def test_an_mtp_layer_declared_but_dropped_is_refused(mtp_oracle, tmp_path, run_cli):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "dropped"
    shutil.copytree(mtp_oracle, src)
    t = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if not k.startswith("model.layers.1.")}
    save_file(t, str(src / "model.safetensors"), metadata={"format": "pt"})
    assert json.loads((src / "config.json").read_text())["num_nextn_predict_layers"] == 1
    res = run_cli("eval", src, "--reference", src, *DRAFT)
    assert res.code == 1
    assert "declares an MTP layer but no tensor is named model.layers.1.*" in res.err and "hint:" in res.err


def test_an_mtp_layer_quantized_outside_tfcompile_is_refused(mtp_oracle, tmp_path):
    """A published FP8 release (DeepSeek-V3's `quantization_config`, no tfcompile manifest): its MTP
    tensors are not decoded, so they are refused by name rather than read as if they were bf16."""
    import pytest

    from tfcompile.draft.mtp_load import check_mtp
    from tfcompile.errors import UserError

    src = tmp_path / "fp8-release"
    shutil.copytree(mtp_oracle, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, quantization_config={"quant_method": "fp8"})))
    with pytest.raises(UserError, match=r"quantized outside tfcompile \(fp8\) is not decoded") as e:
        check_mtp(src)
    assert e.value.hint


def test_glm4_moe_mtp_is_exact_and_two_mtp_layers_are_refused(family_factory, tmp_path):
    """GLM-4.5's MTP layer (DeepSeek's layout, Glm4MoeDecoderLayer) runs and stays exact (DeepSeek-V3.2,
    GLM-5 and Qwen3.5: tests/draft/test_draft_mtp_families.py); a config declaring two MTP layers is
    refused by name, not crashed on."""
    import pytest
    import torch

    from tfcompile.draft.mtp import TARGET_HIDDEN, MTPDrafter
    from tfcompile.draft.mtp_load import check_mtp, load_mtp
    from tfcompile.draft.spec import Target, greedy, speculative
    from tfcompile.errors import UserError
    from tfcompile.evaluate.models import load_candidate

    glm = family_factory.add_mtp_layer(family_factory.make_tiny_glm4_moe(tmp_path / "glm"))
    model = load_candidate(glm, torch.float32).model.eval()
    prompt = list(range(5, 17))
    out, st = speculative(Target(model, TARGET_HIDDEN), MTPDrafter(load_mtp(glm, model)), prompt, 12, 3)
    assert out == greedy(Target(model), prompt, 12) and st.proposed > 0
    cfg = json.loads((glm / "config.json").read_text())
    (glm / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=2)))
    with pytest.raises(UserError, match="num_nextn_predict_layers is 2; --draft mtp measures one MTP layer") as e:
        check_mtp(glm)
    assert e.value.hint
