"""NVFP4 four over six (passes/quantize/four_over_six.py) against an ml_dtypes oracle.

The oracle re-derives every block from the rule alone, in numpy with ml_dtypes' E4M3 and E2M1
casts: global g = 256 * 6 / amax; per block the two candidate scales e4m3(amax_b / c * g) for
c = 6 and c = 4 (0 -> 1.0), each block's elements cast to E2M1 under s / g, and the candidate
with the smaller squared error kept (6 on ties). Codes and scales must be bit-identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from tfcompile.kernels import formats as F
from tfcompile.passes.quantize import four_over_six

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from fmt_oracles import heavy_tailed, ml_e2m1_codes  # noqa: E402


def _oracle(w: np.ndarray):
    amax = np.abs(w).max()
    g = np.float32(256.0 * 6.0) / np.float32(amax)
    blocks = w.reshape(w.shape[0], -1, 16)
    amax_b = np.abs(blocks).max(-1)
    best = None
    for c in (6.0, 4.0):
        s = (amax_b / np.float32(c) * g).astype(np.float32).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
        sf = s.astype(np.float32)
        sf = np.where(sf == 0, np.float32(1.0), sf)
        s = sf.astype(ml_dtypes.float8_e4m3fn)
        mult = (sf / g)[..., None]
        vals = (blocks / mult).clip(-6, 6).astype(ml_dtypes.float4_e2m1fn)
        err = ((vals.astype(np.float32) * mult - blocks) ** 2).sum(-1)
        if best is None:
            best = [err, s, vals]
            continue
        better = err < best[0]
        best[0] = np.where(better, err, best[0])
        best[1] = np.where(better, s.view(np.uint8), best[1].view(np.uint8)).view(ml_dtypes.float8_e4m3fn)
        best[2] = np.where(better[..., None], vals.view(np.uint8), best[2].view(np.uint8)).view(
            ml_dtypes.float4_e2m1fn)
    return g, best[1], best[2]


@pytest.mark.parametrize("kind", ["gauss", "student"])
def test_four_over_six_matches_the_ml_dtypes_oracle(kind):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(96, 256, generator=gen) if kind == "gauss" else heavy_tailed((96, 256), seed=3)
    w = w.bfloat16().float()
    g = four_over_six.global_scale(w.abs().amax().reshape(1))
    q = four_over_six.quantize(w, g)
    og, oscale, ovals = _oracle(w.numpy())
    assert float(g) == float(og)
    assert torch.equal(q.scale.view(torch.uint8), torch.from_numpy(oscale.view(np.uint8).copy()))
    codes = ml_e2m1_codes(torch.from_numpy(ovals.astype(np.float32)).reshape(96, 256))
    assert torch.equal(F.unpack_fp4(q.data), codes)
    assert float(q.scale.float().max()) <= 384  # the 256 normalisation leaves the max->4 scales in range
    chose_four = (q.scale.float() / g > w.reshape(96, -1, 16).abs().amax(-1) / 6 * 1.2).float().mean()
    assert 0.05 < float(chose_four) < 0.95  # both candidates are used on real-valued blocks


def test_four_over_six_beats_the_max_rule():
    """Its block errors are never above max->6 under the same global scale, and its SQNR beats
    plain RTN (max->6, g = 448 * 6 / amax) on Gaussian and heavy-tailed weights."""
    for w in (torch.randn(192, 512, generator=torch.Generator().manual_seed(1)), heavy_tailed((192, 512))):
        w = w.bfloat16().float()
        g = four_over_six.global_scale(w.abs().amax().reshape(1))
        fos, six = four_over_six.quantize(w, g), F.quantize_nvfp4(w, global_scale=g)
        e_fos = (F.dequantize(fos) - w).pow(2).reshape(192, -1, 16).sum(-1)
        e_six = (F.dequantize(six) - w).pow(2).reshape(192, -1, 16).sum(-1)
        assert bool((e_fos <= e_six * (1 + 1e-6)).all())
        rtn = F.quantize_nvfp4(w)
        sq = [10 * torch.log10(w.pow(2).sum() / (F.dequantize(q) - w).pow(2).sum()) for q in (fos, rtn)]
        assert sq[0] > sq[1] + 0.3, sq  # measured: +0.78 dB Gaussian, +0.41 dB Student-t (MSE: +1.24, +0.69)


def test_quantize_with_four_over_six(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "fos"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--set",
                  "quantize.nvfp4_scales=four_over_six", "--set", "quantize.sqnr_rows=0", "--json")
    assert res.code == 0, res.err
    assert run_cli("verify", out).code == 0
    rtn = tmp_path / "rtn"
    assert run_cli("quantize", tiny_llama, "-o", rtn, "--format", "nvfp4a16", "--set", "quantize.sqnr_rows=0").code == 0
    sq = [{x["module"]: x["sqnr_db"] for x in json.loads((p / "tfcompile/manifest.json").read_text())["layers"]}
          for p in (out, rtn)]
    assert sum(sq[0].values()) > sum(sq[1].values())
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "x", "--format", "fp8-dynamic", "--set",
                  "quantize.nvfp4_scales=four_over_six")
    assert res.code == 1 and "needs an NVFP4 format" in res.err and "hint:" in res.err
