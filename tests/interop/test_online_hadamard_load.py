"""The oracle for `quantize.online_hadamard=32`: the artifact loaded by transformers + compressed-tensors 0.20.1
(the real loader, which decompresses W R) with the transform_config's online arguments applied by
compressed-tensors itself (`apply_transform_config`: a forward pre-hook x -> x R on every matched Linear,
before its activation QDQ), exactly what vLLM applies (transform/linear.py keeps only `is_online()`
arguments; the `weight_input` one is already fused into the stored weight, and applying it again would
rotate twice). transformers' loader does not apply transform_config by itself (transformers 5.24
quantizer_compressed_tensors.py never reads it), which is why the test applies it.

Against it: `tfcompile eval`'s emulation of the same artifact (tfcompile/evaluate/models.py), which must
agree to float rounding, and the unquantized model, which the transformed artifact must approximate far
better than the same artifact read without its input transform."""

from __future__ import annotations

import json

import pytest
import torch

ON = ("--set", "quantize.online_hadamard=32")
# (format, order): MXFP4 with its block's order; NVFP4 weight-only with 64, four of its 16-blocks
CASES = [("mxfp4a16", 32), ("mxfp4", 32), ("nvfp4a16", 64)]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def _loaded(out, online: bool):
    from compressed_tensors.transform import TransformConfig, apply_transform_config
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16).eval()
    tc = json.loads((out / "config.json").read_text())["quantization_config"]["transform_config"]
    for group in tc["config_groups"].values():
        group["apply"] = [a for a in group["apply"] if a["location"] == "input"]  # what vLLM applies online
    if online:
        apply_transform_config(model, TransformConfig.model_validate(tc))
        assert sum(n.endswith("_input") for n, _ in model.named_modules()) == 14  # every decoder Linear
    return model


@pytest.mark.parametrize(("fmt", "order"), CASES)
def test_loader_with_its_transform_matches_eval(tiny_llama_src, llama_artifact, ids, fmt, order):
    """Bit for bit. For W4A4 mxfp4 both sides without the activation quantization: compressed-tensors' QDQ
    runs in bf16 arithmetic, tfcompile's emulation in float32 (test_transformers_load.py compares them the
    same way), so the transform and the weights are what is compared."""
    from transformers import AutoModelForCausalLM

    from tfcompile.evaluate.models import load_candidate

    out = llama_artifact(fmt, "--algorithm", "gptq", "--calib", "random", "--calib-samples", "8",
                         "--calib-seq-len", "64", "--set", f"quantize.online_hadamard={order}")
    tc = json.loads((out / "config.json").read_text())["quantization_config"]["transform_config"]
    assert [g["head_dim"] for g in tc["config_groups"].values()] == [order]
    theirs_model = _loaded(out, True)
    for mod in theirs_model.modules():
        if hasattr(mod, "quantization_scheme"):
            mod.quantization_enabled = False
    with torch.no_grad():
        theirs = theirs_model(ids).logits.float()
        ours = load_candidate(out, torch.bfloat16, act_as={"mxfp4": "mxfp4a16"}).model(ids).logits.float()
        served = load_candidate(out, torch.bfloat16).model(ids).logits.float()  # with its activations emulated
        bare = _loaded(out, False)(ids).logits.float()
        orig = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.bfloat16).eval()(ids).logits.float()
    assert torch.equal(theirs, ours), (theirs - ours).abs().max().item()
    # sanity: the transformed artifact is close to the unquantized model; read without x R it is not
    err = (served - orig).abs().mean().item()
    assert err < 0.35 * (bare - orig).abs().mean().item(), (err, (bare - orig).abs().mean().item())
    assert err < 0.1 * orig.abs().max().item(), err
