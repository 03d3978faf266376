"""The registry contract the emit pass, tuner and runtime build on, checked
without compiling: signatures in parameter order, constexprs declared as such,
grids, configs, formats/targets vocabularies; and that interpreter twins leave
the kernel modules and `triton.language` as they found them."""

from __future__ import annotations

import pytest
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from tfcompile.kernels.triton import KERNELS, act_quant, as_interpreted
from tfcompile.kernels.triton.interpret import language
from tfcompile.schemes import SCHEMES

EXPECTED = {
    "act_quant_fp8_static", "act_quant_fp8_token", "act_quant_fp8_group", "act_quant_mxfp4", "act_quant_mxfp8",
    "act_quant_nvfp4", "fp8_gemm_tensor", "fp8_gemm_channel", "fp8_gemm_block", "fp4_gemm_mxfp4",
    "fp4_gemm_nvfp4", "mxfp8_gemm", "w4a16_gemm_nvfp4", "w4a16_gemm_mxfp4", "splitk_reduce",
}
H100_SMEM = 227 * 1024  # max dynamic shared memory per block on sm_90 and sm_100


def test_every_kernel_registered():
    """Ours are all there, and nothing else in the package registers (other test
    suites may register stand-in kernels of their own in the same process)."""
    ours = {n for n, kd in KERNELS.items() if kd.fn.fn.__module__.startswith("tfcompile.kernels.triton")}
    assert ours == EXPECTED


def test_every_scheme_has_its_kernels():
    """W4A4/W8A8 schemes need an activation quantizer and a GEMM; weight-only a GEMM."""
    for name, scheme in SCHEMES.items():
        kinds = {KERNELS[k].kind for k in EXPECTED if name in KERNELS[k].formats}
        assert "gemm" in kinds, name
        assert ("act_quant" in kinds) == (scheme.act is not None), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("m", [1, 129])
def test_kernel_definition(name, m):
    kd = KERNELS[name]
    assert isinstance(kd.fn, (JITFunction, InterpretedFunction))  # twins give the other mode
    assert set(kd.formats) <= set(SCHEMES) and set(kd.targets) <= {"sm_90a", "sm_100a"}
    assert kd.kind in ("gemm", "act_quant", "reduce")
    for cfg in [kd.default_config, *kd.presets.values()]:
        cfg = {**kd.default_config, **cfg}
        n, k = 4096, 7168
        sig, consts = kd.signature(n, k, cfg), kd.constexprs(n, k, cfg)
        assert list(sig) == list(kd.fn.arg_names)  # parameter order
        assert {a for a, t in sig.items() if t == "constexpr"} == set(consts)
        assert sig["M"] == "i32" and all(t.startswith("*") for a, t in sig.items() if a.endswith("_ptr"))
        grid = kd.grid(m, n, k, cfg)
        assert 1 <= len(grid) <= 3 and all(isinstance(g, int) and g >= 1 for g in grid)
        assert set(kd.knobs) <= set(cfg) and {"num_warps", "num_stages"} <= set(cfg)
        assert 0 <= kd.smem_bytes(cfg) <= H100_SMEM
        assert kd.flops(m, n, k) > 0 and kd.bytes_moved(m, n, k) > 0
    assert kd.launch is not None or kd.kind == "reduce"
    assert kd.followup is None or kd.followup in KERNELS


def test_twins_leave_modules_and_language_alone():
    before = dict(vars(act_quant))
    lang_before = {n: v for n, v in vars(tl).items() if isinstance(v, JITFunction)}
    twin = as_interpreted(act_quant.mx_act_quant_kernel)
    assert twin is as_interpreted(act_quant.mx_act_quant_kernel)  # memoised
    with language("interp"):
        assert not isinstance(tl.max, JITFunction)
    assert dict(vars(act_quant)) == before
    assert {n: v for n, v in vars(tl).items() if isinstance(v, JITFunction)} == lang_before
