"""tfcompile.runtime on a GPU: the artifact's own cubins against the emulated path.

Skipped without a CUDA GPU of an emitted target (sm_90a / sm_100a)."""

from __future__ import annotations

import pytest
import torch

from tfcompile.runtime import load_artifact

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), pytest.mark.gpu]


def _target() -> str:
    from tfcompile.tune.hardware import target_of_capability

    target = target_of_capability(*torch.cuda.get_device_capability())
    if target is None:
        pytest.skip("this GPU is neither sm_90a nor sm_100a")
    return target


@pytest.mark.parametrize("fmt", ["fp8", "fp8-dynamic", "fp8-block", "nvfp4a16", "mxfp4a16", "nvfp4", "mxfp4"])
def test_cubins_match_the_emulation(runtime_artifact, fmt):
    target = _target()
    path = runtime_artifact(fmt, "--target", target, "--set", "emit.buckets=[1,16,64]")
    art = load_artifact(path, "cuda")
    assert art.kernels == "triton" and art.target == target, art.warnings
    emu = load_artifact(path, "cuda", kernels="emulated")
    weight_only = not art.linears[next(iter(art.linears))].runner.act  # e.g. NVFP4 on sm_90a: W4A16
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, ql in art.linears.items():
        ref_mod = emu.linears[name]
        if weight_only:
            ref_mod.act_kind = None
        for m in (1, 7, 64, 100):  # 100: above the largest bucket, runs its kernels
            x = torch.randn(m, ql.in_features, device="cuda", dtype=torch.bfloat16, generator=gen)
            y = ql(x).float()
            ref = ref_mod(x.float())
            rel = ((y - ref).norm() / ref.norm()).item()
            assert y.shape == (m, ql.out_features) and rel < 2e-2, (name, m, rel)
