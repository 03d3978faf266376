"""On a GPU: the CUTLASS GEMMs against the formats reference (skipped on CPU machines).

Each emitted library is called directly (runtime.cutlass.CutlassLibrary) on random operands
encoded with tfcompile.kernels.formats, and compared with an fp32 matmul of the decoded
operands; then the whole demo LM's Linears run through `load_artifact(kernels="cutlass")`
and are compared with the emulated QuantLinear. Tolerances: the GEMM sums exact products
(decoded elements are short floats) in another order in fp32 (bound 2(K+8)*2^-24*|A||B|^T)
plus one bf16 rounding of the output (2^-8 relative); FP8 fast accumulation on Hopper keeps
fewer bits in the tensor core, so FP8 gets 2^-7.
"""

from __future__ import annotations

import pytest
import torch
from cutlass_support import needs_nvcc

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), needs_nvcc,
              pytest.mark.slow, pytest.mark.gpu]


def _target():
    from tfcompile.tune.hardware import target_of_capability

    return target_of_capability(*torch.cuda.get_device_capability())


FORMAT_OF = {"sm_90a": ("fp8",), "sm_100a": ("nvfp4", "mxfp4")}


def _operands(fmt: str, m: int, n: int, k: int):
    """(a, sa, b, sb, alpha, flags, reference fp32 [M, N]) on the GPU, encoded by the formats reference."""
    from tfcompile.kernels import formats as F

    gen = torch.Generator().manual_seed(m * 7 + n)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    if fmt == "fp8":  # per-token x per-channel scales: flags 1 | 2
        qa, qb = F.quantize_fp8(x, "channel"), F.quantize_fp8(w, "channel")
        ref = F.dequantize(qa, torch.float32) @ F.dequantize(qb, torch.float32).T
        return [qa.data.cuda(), qa.scale.float().reshape(-1).cuda(), qb.data.cuda(),
                qb.scale.float().reshape(-1).cuda(), None, 3, ref.cuda()]
    quant = F.quantize_nvfp4 if fmt == "nvfp4" else F.quantize_mxfp4
    qa, qb = quant(x), quant(w)
    # dequantize divides by the NVFP4 global scales: exactly the kernel's alpha = 1 / (g_a * g_b)
    ref = F.dequantize(qa, torch.float32) @ F.dequantize(qb, torch.float32).T
    sfa = F.to_blackwell_scale_layout(qa.scale.reshape(m, -1))
    sfb = F.to_blackwell_scale_layout(qb.scale.reshape(n, -1))
    alpha = torch.ones(1)
    if fmt == "nvfp4":
        alpha = (1.0 / (qa.global_scale.float() * qb.global_scale.float())).reshape(1)
    return [t.contiguous().cuda() for t in (qa.data, sfa, qb.data, sfb, alpha)] + [0, ref.cuda()]


@pytest.mark.parametrize("m", [1, 77, 512])
def test_libraries_match_the_formats_reference(demo_artifact, m):
    import json

    from tfcompile.runtime.cutlass import CutlassLibrary

    target = _target()
    if target is None:
        pytest.skip("GPU is not sm_90a / sm_100a")
    for fmt in FORMAT_OF[target]:
        out_dir, _ = demo_artifact(fmt)
        for so in sorted((out_dir / "kernels" / target / "cutlass").glob("*.so")):
            lib = CutlassLibrary(so, json.loads(so.with_suffix(".json").read_text()))
            for n, k in ((256, 768), (768, 256)):
                a, sa, b, sb, alpha, flags, ref = _operands(fmt, m, n, k)
                if fmt == "fp8" and m == 1:
                    sa = sa[:1]  # per-tensor A scale too: flags bit 0 off
                    flags = 2  # (one row: the same reference)
                out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                assert lib.can_implement(m, n, k, flags)
                lib.gemm(a, b, sa, sb, alpha, out, m, n, k, flags)
                torch.cuda.synchronize()
                tol = (2 ** -7 if fmt == "fp8" else 2 ** -8) * ref.abs().max().item() + 1e-6
                err = (out.float() - ref).abs().max().item()
                assert err <= tol, (so.name, m, n, k, err, tol)


def test_load_artifact_runs_the_cutlass_kernels(demo_artifact):
    from cutlass_support import DEMO, quantize

    from tfcompile.runtime import load_artifact

    target = _target()
    if target is None:
        pytest.skip("GPU is not sm_90a / sm_100a")
    fmt = FORMAT_OF[target][0]
    out_dir, _ = demo_artifact(fmt)
    if not (out_dir / "kernels" / "index.json").is_file():  # the act-quant kernels come from `emit`
        out_dir = out_dir.parent / f"{fmt}-with-triton"
        quantize(DEMO, out_dir, fmt, "--target", target, "--set", "emit_cutlass.compile=always",
                 "--set", "emit.buckets=[1,16,64,256,1024,4096]")
    art = load_artifact(out_dir, "cuda", kernels="cutlass", require=True)
    assert art.kernels == "cutlass"
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, ql in list(art.linears.items())[:7]:
        for m in (1, 33, 300):
            x = torch.randn(m, ql.in_features, generator=gen, device="cuda").to(torch.bfloat16)
            y, ref = ql(x).float(), ql.emulated(x.float())
            rel = ((y - ref).norm() / ref.norm()).item()
            assert rel < 2e-2, (name, m, rel)
