"""Issue 26 item 2, "serve what is written", for per-tensor FP8 (`--format fp8`): vLLM fuses q/k/v
and gate/up (and a MoE expert's gate/up) into one Linear with one per-tensor weight scale and, in
`CompressedTensorsW8A8Fp8.process_weights_after_loading` -> `process_fp8_weight_tensor_strategy`,
requantizes every member to the group's largest scale (vllm/model_executor/layers/quantization/
utils/w8a8_utils.py `requantize_with_max_scale`). tfcompile writes every member with that one scale,
so the requantization is the identity: checked here by running vLLM's arithmetic (re-implemented
below from its source, not tfcompile's) on the artifact's bytes. The scale itself is checked against
the source weights: the group's largest max|w| / 448, rounded up to the model dtype.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

CALIB = ("--set", "calibrate.samples=4", "--set", "calibrate.seq_len=16")
E4M3_MAX = 448.0
# vLLM's fused layers (packed_modules_mapping): member -> the fused name's role
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _tensors(art: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(art.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _groups(names) -> dict[str, list[str]]:
    """{fused layer: [member module, ...]} for the modules with a weight_scale, in vLLM's order."""
    groups = defaultdict(list)
    for n in sorted(names):
        m = re.fullmatch(r"(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight_scale", n)
        if m:
            groups[f"{m[1]}.{FUSED[m[2]]}"].append(f"{m[1]}.{m[2]}")
    order = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    return {k: sorted(v, key=lambda s: order.index(s.rpartition(".")[2])) for k, v in groups.items()}


def vllm_requantize_with_max_scale(weight: torch.Tensor, scales: torch.Tensor, widths: list[int]):
    """vLLM's `requantize_with_max_scale` on CPU: each shard dequantized (`per_tensor_dequantize`:
    the fp8 values in float16 times its scale), then quantized with the largest scale
    (`scaled_fp8_quant`: x / scale in float32, clamped to +-448, cast to E4M3)."""
    max_scale = scales.max()
    out = weight.clone()
    start = 0
    for i, width in enumerate(widths):
        dq = weight[start:start + width].to(torch.float16) * scales[i]
        out[start:start + width] = (dq.float() / max_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        start += width
    return max_scale, out


@pytest.fixture(scope="module")
def fp8_artifacts(model_factory, tmp_path_factory):
    from tfcompile.cli.main import main

    root = tmp_path_factory.mktemp("fp8fused")
    out = {}
    for name, make in (("dense", model_factory.make_tiny_llama), ("moe", model_factory.make_tiny_qwen3_moe)):
        src = make(root / f"{name}-src")
        for fmt in ("fp8", "fp8-dynamic"):
            art = root / f"{name}-{fmt}"
            assert main(["quantize", str(src), "-o", str(art), "--format", fmt, "-q",
                         *(CALIB if fmt == "fp8" else ())]) == 0
            out[name, fmt] = (src, art)
    return out


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_vllm_requantization_of_fused_groups_is_the_identity(model, fp8_artifacts):
    _, art = fp8_artifacts[model, "fp8"]
    t = _tensors(art)
    groups = _groups(t)
    assert groups and any(len(v) == 3 for v in groups.values()) and any(len(v) == 2 for v in groups.values())
    for fused, members in groups.items():
        weight = torch.cat([t[f"{m}.weight"] for m in members])
        scales = torch.stack([t[f"{m}.weight_scale"].float().reshape(()) for m in members])
        max_scale, served = vllm_requantize_with_max_scale(weight, scales, [t[f"{m}.weight"].shape[0]
                                                                              for m in members])
        assert torch.equal(served.view(torch.uint8), weight.view(torch.uint8)), f"{fused} is served otherwise"
        assert torch.equal(scales, max_scale.expand_as(scales)), f"{fused}: member scales {scales.tolist()}"


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_the_shared_scale_is_the_groups_largest_amax_over_448(model, fp8_artifacts):
    src, art = fp8_artifacts[model, "fp8"]
    t, s = _tensors(art), _tensors(src)
    for fused, members in _groups(t).items():
        amax = max(s[f"{m}.weight"].float().abs().max().item() for m in members)
        want = torch.tensor(amax / E4M3_MAX, dtype=torch.float32)
        stored = t[f"{members[0]}.weight_scale"]
        low = want.to(stored.dtype)  # rounded up to the stored dtype: the largest weight never clips
        want = low if low.float() >= want else torch.nextafter(low, torch.tensor(float("inf"), dtype=low.dtype))
        assert stored.reshape(()).item() == want.item(), (fused, stored, want)
        # and the members' data is their source weight divided by that one scale, rounded to E4M3
        for m in members:
            ref = (s[f"{m}.weight"].float() / stored.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            assert torch.equal(t[f"{m}.weight"].view(torch.uint8), ref.view(torch.uint8)), m


def test_per_channel_scales_stay_each_members_own(fp8_artifacts):
    """fp8-dynamic: per-channel scales are concatenated by vLLM as they are, so nothing is shared."""
    src, art = fp8_artifacts["dense", "fp8-dynamic"]
    t, s = _tensors(art), _tensors(src)
    for fused, members in _groups(t).items():
        for m in members:
            rows = s[f"{m}.weight"].float().abs().amax(dim=1, keepdim=True) / E4M3_MAX
            assert torch.all(t[f"{m}.weight_scale"].float() >= rows), m
            assert torch.allclose(t[f"{m}.weight_scale"].float(), rows, rtol=1e-2), m
