"""`tfcompile quantize --export modelopt` vs a real modelopt 0.47 export of the same model.

modelopt is the oracle: mtq.quantize(model, CFG, forward_loop) then
modelopt.torch.export.export_hf_checkpoint on the same tiny Llama. On this CPU
machine every config used here calibrates and exports (the forward loop only
collects amax; no CUDA kernel is needed). Known mismatches of our view are
marked xfail(strict=True) with the reason, so a fix turns them into XPASS
(a failure) and the mark must then be removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interop_util import read_tensors

import modelopt.torch.quantization  # noqa: E402,F401  (needs `requests`: the test extra has it)

# tfcompile format -> modelopt config that produces the same scheme
MODELOPT_CFG = {
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "nvfp4a16": "W4A16_NVFP4_CFG",
    "mxfp4": "MXFP4_DEFAULT_CFG",
    "mxfp8": "MXFP8_DEFAULT_CFG",
    "fp8": "FP8_DEFAULT_CFG",
    "fp8-dynamic": "FP8_PER_CHANNEL_PER_TOKEN_CFG",
    "fp8-block": "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG",
}
# Each format costs one modelopt quantize + export; the default job compares the two that
# serving uses most, the slow job (CI's second step) the other five.
DEFAULT_JOB = ("nvfp4", "fp8")
FMTS = [f if f in DEFAULT_JOB else pytest.param(f, marks=pytest.mark.slow) for f in MODELOPT_CFG]


def _xf(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def _params(known: dict[str, str]):
    return [pytest.param(f, marks=[_xf(known[f])] + ([] if f in DEFAULT_JOB else [pytest.mark.slow]))
            if f in known else p for f, p in zip(MODELOPT_CFG, FMTS)]


@pytest.fixture(scope="session")
def modelopt_export(tiny_llama_src, tmp_path_factory):
    """modelopt_export("nvfp4") -> directory of modelopt's own export of the tiny Llama."""
    cache: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("modelopt-export")

    def get(fmt: str) -> Path:
        if fmt not in cache:
            import modelopt.torch.quantization as mtq
            from modelopt.torch.export import export_hf_checkpoint
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.bfloat16).eval()
            ids = torch.randint(4, 256, (2, 32), generator=torch.Generator().manual_seed(0))

            def loop(m):
                with torch.no_grad():
                    m(ids)

            mtq.quantize(model, getattr(mtq, MODELOPT_CFG[fmt]), loop)
            out = root / fmt
            export_hf_checkpoint(model, export_dir=str(out))
            cache[fmt] = out
        return cache[fmt]

    return get


@pytest.fixture(scope="session")
def ours(llama_artifact):
    def get(fmt: str, *extra: str) -> Path:
        return llama_artifact(fmt, "--export", "modelopt", *extra) / "modelopt"
    return get


def _hf_quant(d: Path) -> dict:
    return json.loads((d / "hf_quant_config.json").read_text())["quantization"]


def _qcfg(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())["quantization_config"]


# ---------------------------------------------------------------- tensors

@pytest.mark.parametrize("fmt", _params({
    "fp8-block": ("modelopt's fp8_pb_wo export does not write the (ceil(N/128), ceil(K/128)) grid: "
                  "measured (1, 1, 2, 1) for a 128x256 weight in this suite, 0-d in a fresh process; "
                  "ours keeps the grid (vLLM/DeepSeek layout)"),
}))
def test_tensor_names_dtypes_shapes(fmt, ours, modelopt_export):
    mine, theirs = read_tensors(ours(fmt)), read_tensors(modelopt_export(fmt))
    assert sorted(mine) == sorted(theirs), (sorted(set(mine) ^ set(theirs)))
    bad = [(k, (mine[k].dtype, tuple(mine[k].shape)), (theirs[k].dtype, tuple(theirs[k].shape)))
           for k in sorted(mine)
           if mine[k].dtype != theirs[k].dtype or mine[k].shape != theirs[k].shape]
    assert not bad, f"{len(bad)} tensors differ (ours, modelopt): {bad[:4]}"


# ---------------------------------------------------------------- hf_quant_config.json

@pytest.mark.parametrize("fmt", FMTS)
def test_quant_algo(fmt, ours, modelopt_export):
    assert _hf_quant(ours(fmt))["quant_algo"] == _hf_quant(modelopt_export(fmt))["quant_algo"]


@pytest.mark.parametrize("fmt", FMTS)
def test_group_and_block_size(fmt, ours, modelopt_export):
    mine, theirs = _hf_quant(ours(fmt)), _hf_quant(modelopt_export(fmt))
    for key in ("group_size", "block_size"):
        assert mine.get(key) == theirs.get(key), key


@pytest.mark.parametrize("fmt", FMTS)
def test_exclude_modules(fmt, ours, modelopt_export):
    assert _hf_quant(ours(fmt))["exclude_modules"] == _hf_quant(modelopt_export(fmt))["exclude_modules"]


@pytest.mark.parametrize("fmt", FMTS)
def test_kv_cache_quant_algo_and_producer(fmt, ours, modelopt_export):
    d = ours(fmt)
    assert _hf_quant(d)["kv_cache_quant_algo"] == _hf_quant(modelopt_export(fmt))["kv_cache_quant_algo"]
    assert json.loads((d / "hf_quant_config.json").read_text())["producer"]["name"] == "tfcompile"


# ---------------------------------------------------------------- config.json quantization_config

@pytest.mark.parametrize("fmt", FMTS)
def test_config_json_quantization_config(fmt, ours, modelopt_export):
    mine, theirs = _qcfg(ours(fmt)), _qcfg(modelopt_export(fmt))
    assert mine["quant_method"] == theirs["quant_method"] == "modelopt"
    assert mine.get("ignore") == theirs["ignore"]
    assert mine["quant_algo"] == theirs["quant_algo"]
    assert mine.get("config_groups") == theirs.get("config_groups")


# ---------------------------------------------------------------- numbers

def _linear_modules(t: dict) -> list[str]:
    return sorted(k[: -len(".weight_scale")] for k in t if k.endswith(".weight_scale"))


@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("nvfp4a16", marks=pytest.mark.slow)])
def test_nvfp4_numbers(fmt, ours, modelopt_export, record_property):
    """weight_scale_2 within 1 fp32 ulp; FP4 codes and E4M3 scales equal except rare ties. modelopt
    scales by the block max: so do we with `scale_search=none` (W4A4 RTN searches by default)."""
    plain = ("--set", "quantize.scale_search=none") if fmt == "nvfp4" else ()
    mine, theirs = read_tensors(ours(fmt, *plain)), read_tensors(modelopt_export(fmt))
    mods = _linear_modules(theirs)
    assert len(mods) == 14
    code_diff = scale_diff = total_codes = total_scales = 0
    for m in mods:
        a, b = mine[f"{m}.weight_scale_2"].float().reshape(()), theirs[f"{m}.weight_scale_2"].float().reshape(())
        ulp = torch.finfo(torch.float32).eps * b.abs()
        assert (a - b).abs() <= ulp, (m, a.item(), b.item())
        sa, sb = mine[f"{m}.weight_scale"], theirs[f"{m}.weight_scale"]
        scale_diff += int((sa.view(torch.uint8) != sb.view(torch.uint8)).sum())
        total_scales += sa.numel()
        from tfcompile.kernels.formats import unpack_fp4
        ca, cb = unpack_fp4(mine[f"{m}.weight"]), unpack_fp4(theirs[f"{m}.weight"])
        code_diff += int((ca != cb).sum())
        total_codes += ca.numel()
    record_property("nvfp4_scale_diff_frac", scale_diff / total_scales)
    record_property("nvfp4_code_diff_frac", code_diff / total_codes)
    # measured 0 / 0 on this model; allow rounding ties (< 0.1%), never systematic drift
    assert scale_diff / total_scales < 1e-3, (scale_diff, total_scales)
    assert code_diff / total_codes < 1e-3, (code_diff, total_codes)
    if fmt == "nvfp4":  # W4A4: input_scale names a static per-tensor activation scale
        for m in mods:
            assert mine[f"{m}.input_scale"].dtype == torch.float32 and mine[f"{m}.input_scale"].item() > 0


@pytest.mark.slow
def test_mxfp4_numbers_with_modelopt_rule(ours, modelopt_export, tiny_llama_src, record_property):
    """modelopt's MXFP4 scale rule is ceil (RCEIL): with --set quantize.mx_rule=ceil the E8M0
    scales are identical. FP4 codes differ only on exact rounding ties: modelopt's cast_fp4
    counts bounds with a strict `>`, i.e. rounds ties toward zero (0.75 -> 0.5, 1.75 -> 1.5,
    3.5 -> 3), we round ties to even (OCP; 0.75 -> 1, 1.75 -> 2, 3.5 -> 4)."""
    from safetensors.torch import load_file

    from tfcompile.kernels.formats import decode_e2m1, decode_e8m0, unpack_fp4

    src = load_file(str(tiny_llama_src / "model.safetensors"))
    mine = read_tensors(ours("mxfp4", "--set", "quantize.mx_rule=ceil"))
    theirs = read_tensors(modelopt_export("mxfp4"))
    diff = total = 0
    for m in _linear_modules(theirs):
        assert torch.equal(mine[f"{m}.weight_scale"], theirs[f"{m}.weight_scale"]), m
        ca, cb = unpack_fp4(mine[f"{m}.weight"]), unpack_fp4(theirs[f"{m}.weight"])
        x = src[f"{m}.weight"].float() / decode_e8m0(mine[f"{m}.weight_scale"]).repeat_interleave(32, -1)
        d = ca != cb
        ties = x[d].abs()
        assert bool(torch.isin(ties, torch.tensor([0.75, 1.75, 3.5])).all()), (m, ties[:8])
        va, vb = decode_e2m1(ca[d]), decode_e2m1(cb[d])
        assert bool((vb.abs() < ties).all() and (va.abs() > ties).all()), m  # they: toward 0, we: even
        diff += int(d.sum())
        total += d.numel()
    record_property("mxfp4_tie_code_diff_frac", diff / total)
    assert diff / total < 0.02  # measured 0.48% on this bf16 model


@pytest.mark.slow
def test_mxfp4_default_rule_differs_from_modelopt(ours, modelopt_export, record_property):
    """Our default MX rule (floor, OCP) picks a smaller exponent than modelopt's ceil on some blocks."""
    mine, theirs = read_tensors(ours("mxfp4")), read_tensors(modelopt_export("mxfp4"))
    diff = total = 0
    for m in _linear_modules(theirs):
        a, b = mine[f"{m}.weight_scale"].int(), theirs[f"{m}.weight_scale"].int()
        assert bool(((b - a) >= 0).all() and ((b - a) <= 1).all()), m  # floor <= ceil <= floor + 1
        diff += int((a != b).sum())
        total += a.numel()
    record_property("mxfp4_floor_vs_ceil_scale_diff_frac", diff / total)
    assert 0 < diff / total < 1


def _fused_members(module: str) -> list[str]:
    """The members of the fused layer vLLM builds `module` into (itself when it is not fused)."""
    parent, _, leaf = module.rpartition(".")
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        if leaf in group:
            return [f"{parent}.{g}" for g in group]
    return [module]


def test_fp8_numbers(ours, modelopt_export, record_property):
    """FP8 per tensor: modelopt keeps each Linear's amax/448 in fp32; we store one scale per fused
    q/k/v or gate/up group (the members' largest, what vLLM requantizes them to at load: issue 26
    item 2) rounded *up* to the model dtype (bf16, compressed-tensors' convention), so ours >= the
    group's largest of theirs within one bf16 ulp, and the E4M3 codes differ where that larger
    scale moves a value across a rounding step."""
    mine, theirs = read_tensors(ours("fp8")), read_tensors(modelopt_export("fp8"))
    diff = total = 0
    for m in _linear_modules(theirs):
        a = mine[f"{m}.weight_scale"].float()
        group = [g for g in _fused_members(m) if f"{g}.weight_scale" in theirs]
        b = max(theirs[f"{g}.weight_scale"].float() for g in group)
        assert a.shape == theirs[f"{m}.weight_scale"].shape == ()
        assert b <= a <= b * (1 + 2 ** -7), (m, a.item(), b.item())
        diff += int((mine[f"{m}.weight"].float() != theirs[f"{m}.weight"].float()).sum())
        total += mine[f"{m}.weight"].numel()
    record_property("fp8_code_diff_frac", diff / total)
    assert diff / total < 0.25
