"""The calibration forwards' compute dtype follows the CPU (issue 32): float32 where bf16 is
emulated, the checkpoint's bf16 where it is native; `calibrate.dtype` forces one; the run says
which (stderr, --json, the manifest's `calibration.compute_dtype`).

Oracle for the statistics: transformers' own float32 model (`from_pretrained`, its whole
forward, forward pre-hooks on the Linears) over the same token ids, an independent path from
the layer loop's bound mmap views and captured layer inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfcompile import machine
from tfcompile.calibration.datasets import calibration_tokens, tokens_sha256
from tfcompile.errors import RecipeError
from tfcompile.recipe.build import build_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-llama"  # committed bf16 Llama (hidden 128, 2 layers), with its tokenizer
SAMPLES, SEQ, SEED = 4, 48, 5
CALIB = ("--calib", "random", "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ),
         "--calib-seed", str(SEED))


@pytest.fixture(autouse=True)
def _no_onednn_cap(monkeypatch):
    """The rule reads ONEDNN_MAX_CPU_ISA; a developer's shell must not decide these tests."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


@pytest.mark.parametrize("native, model, device, want", [
    (False, "BF16", "cpu", "float32"),  # bf16 emulated (AVX2): float32 is ~9x faster
    (True, "BF16", "cpu", "bfloat16"),  # AVX512-BF16 / AMX / Arm BF16: the checkpoint's dtype
    (False, "F32", "cpu", "float32"),
    (True, "F32", "cpu", "float32"),  # never narrower than the checkpoint
    (False, "F16", "cpu", "float16"),  # fp16 checkpoints keep their dtype (not bf16's rule)
    (False, "BF16", "cuda", "bfloat16"),  # a GPU computes bf16 natively
])
def test_auto_follows_the_cpu(monkeypatch, native, model, device, want):
    monkeypatch.setattr(machine, "native_bf16", lambda: native)
    dtype, why = machine.compute_dtype("auto", model, device)
    assert dtype == want and why


@pytest.mark.parametrize("cap, want", [("AVX2", "float32"), ("avx512_core", "float32"),
                                       ("AVX512_CORE_BF16", "bfloat16"), ("AVX512_CORE_AMX", "bfloat16"), ("", "bfloat16")])
def test_onednn_capped_below_bf16_emulates_it(monkeypatch, cap, want):
    """ONEDNN_MAX_CPU_ISA=AVX2 (how bench/calibrate.py stands in for an AVX2 machine) makes bf16 slow."""
    monkeypatch.setattr(machine, "native_bf16", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert machine.compute_dtype("auto", "BF16")[0] == want


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("forced", ["float32", "bfloat16"])
def test_a_forced_dtype_wins(monkeypatch, native, forced):
    monkeypatch.setattr(machine, "native_bf16", lambda: native)
    assert machine.compute_dtype(forced, "BF16") == (forced, "forced")
    assert machine.compute_dtype(forced, "F32", "cuda") == (forced, "forced")


def test_an_unknown_dtype_is_a_recipe_error_with_a_hint():
    with pytest.raises(RecipeError) as e:
        build_recipe(fmt="nvfp4", sets=["calibrate.dtype=fp16"])
    assert "calibrate.dtype 'fp16'" in str(e.value) and "calibrate.dtype=auto" in e.value.hint


def _run(run_cli, out: Path, *extra: str) -> tuple[dict, dict, str]:
    """(manifest, --json document, stderr) of a calibrated nvfp4 run on the tiny Llama."""
    res = run_cli("quantize", TINY, "-o", out, "--format", "nvfp4", *CALIB, "--json", "--device", "cpu", *extra)
    assert res.code == 0, res.err
    return json.loads((out / "tfcompile" / "manifest.json").read_text()), res.json(), res.err


def _recorded(manifest: dict) -> str:
    (cal,) = [p["config"] for p in manifest["recipe"]["passes"] if p["name"] == "calibrate"]
    return cal["dtype"]


@pytest.mark.parametrize("native, want", [(False, "float32"), (True, "bfloat16")])
def test_auto_is_reported_and_recorded_and_equals_forcing_it(run_cli, tmp_path, monkeypatch, native, want):
    monkeypatch.setattr(machine, "native_bf16", lambda: native)
    auto, doc, err = _run(run_cli, tmp_path / "auto")
    assert auto["calibration"]["compute_dtype"] == want and _recorded(auto) == "auto"
    assert doc["passes"]["calibrate"]["compute_dtype"] == want
    assert f"forwards in {want}" in err  # the log line on stderr
    forced, _, err = _run(run_cli, tmp_path / "forced", "--set", f"calibrate.dtype={want}")
    assert forced["calibration"]["compute_dtype"] == want and _recorded(forced) == want
    assert f"forwards in {want}: forced" in err
    # auto resolved to D computes what forcing D computes: the same weights and scales
    assert (tmp_path / "auto" / "model.safetensors").read_bytes() == \
        (tmp_path / "forced" / "model.safetensors").read_bytes()


def _oracle_amax(ids: torch.Tensor) -> dict[str, float]:
    """max |x| at every decoder Linear's input: transformers' float32 model, one sequence at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    amax: dict[str, float] = {}

    def hook(name):
        def record(_mod, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
        return record

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            mod.register_forward_pre_hook(hook(name))
    with torch.inference_mode():
        for row in ids:
            model(input_ids=row[None], use_cache=False)
    return amax


def _artifact_amax(out: Path) -> dict[str, float]:
    """Input amax per Linear from the artifact: input_global_scale = 448 * 6 / amax (float32)."""
    tensors = load_file(str(out / "model.safetensors"))
    suffix = ".input_global_scale"
    return {k[: -len(suffix)]: 2688.0 / float(v) for k, v in tensors.items() if k.endswith(suffix)}


def test_float32_statistics_match_a_plain_float32_forward_and_bf16_is_close(run_cli, tmp_path):
    f32, _, _ = _run(run_cli, tmp_path / "f32", "--set", "calibrate.dtype=float32")
    bf16, _, _ = _run(run_cli, tmp_path / "bf16", "--set", "calibrate.dtype=bfloat16")
    from transformers import AutoConfig

    ids = calibration_tokens("random", None, samples=SAMPLES, seq_len=SEQ, seed=SEED,
                             vocab=AutoConfig.from_pretrained(TINY).vocab_size)
    assert tokens_sha256(ids) == f32["calibration"]["tokens_sha256"] == bf16["calibration"]["tokens_sha256"]
    want = _oracle_amax(ids)
    got32, got16 = _artifact_amax(tmp_path / "f32"), _artifact_amax(tmp_path / "bf16")
    assert set(got32) == set(got16) == set(want) and len(want) == 14  # 2 layers x 7 Linears
    for m, a in want.items():
        assert 0 < a < 1e4 and got32[m] == pytest.approx(a, rel=1e-6), m  # float32: only the sums' order differs (measured 6e-8)
        assert got16[m] == pytest.approx(a, rel=1e-2), m  # bf16 activations: within its rounding (3e-3)
    assert max(abs(got16[m] / a - 1) for m, a in want.items()) > 1e-5  # the two dtypes really ran
