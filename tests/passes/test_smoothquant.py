"""SmoothQuant (passes/quantize/smoothquant.py): the scale rule, the search never above RTN on
its rows, a W4A4 / FP8-static group with activation outlier channels gains, and the artifact
verifies and records what it did."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tfcompile.passes.quantize.awq import fold_norm, search
from tfcompile.ir import Program
from tfcompile.passes.quantize.smoothquant import GRID, smooth_candidates, smooth_scales
from tfcompile.schemes import get_scheme

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_awq import CALIB, _group, _loss  # noqa: E402


def test_scale_rule():
    x = torch.tensor([1.0, 16.0, 4.0, 0.25])
    w = torch.tensor([4.0, 1.0, 2.0, 1.0])
    s = smooth_scales(x, w, 0.5)
    raw = (x.sqrt() / w.sqrt())  # the paper's s_j = max|x_j|^a / max|W_j|^(1-a)
    assert torch.allclose(s, raw / (raw.max() * raw.min()).sqrt())
    assert torch.allclose(s.max() * s.min(), torch.tensor(1.0))
    assert torch.allclose(smooth_scales(x, w, 1.0), x / (x.max() * x.min()).sqrt())


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "nvfp4a16", "mxfp4"])
def test_search_never_worse_than_rtn_and_gains_with_outliers(fmt):
    ws, st, members = _group()
    prog = Program(get_scheme(fmt), "smoothquant", (), {}, "floor", 16)
    norm_w = torch.ones(256, dtype=torch.bfloat16)
    fold, folded = search(st, norm_w, [w.float() for w in ws], members, prog, torch.bfloat16,
                          candidates=smooth_candidates)
    assert fold.alpha in (0.0,) + GRID and fold.loss <= fold.rtn_loss
    assert fold.rtn_loss == pytest.approx(_loss(fmt, ws, members, st.rows, torch.ones(256), st.max_abs), rel=1e-5)
    assert fold.loss == pytest.approx(_loss(fmt, ws, members, st.rows, fold.s, st.max_abs), rel=1e-5)
    cands = dict(smooth_candidates(st, [w.float() for w in ws]))
    assert torch.equal(folded, fold_norm(norm_w, cands[fold.alpha])[0])
    # static activation scales: the outlier channels set the scale. NVFP4's E2M1 elements cannot
    # carry 20x outliers (measured: 0.31 of RTN's loss). E4M3 has the range: fp8 gained 3% while each
    # member had its own weight scale; with the fused group's one scale (issue 26 item 2, what vLLM
    # serves) every alpha > 0 is 0.7-5% above RTN on this group, so the search keeps RTN (alpha 0)
    bound = {"nvfp4": 0.6}.get(fmt)
    if bound:
        assert fold.alpha > 0 and fold.loss < bound * fold.rtn_loss, (fold.alpha, fold.loss / fold.rtn_loss)


def test_quantize_with_smoothquant(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "sq"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8", "--algorithm", "smoothquant",
                  "--json", "-q", *CALIB)
    assert res.code == 0, res.err
    assert res.json()["passes"]["calibrate"]["awq_groups"] == 4
    layers = res.json()["layers"]
    smoothed = [x for x in layers if x["algorithm"] == "smoothquant"]
    assert len(smoothed) == 10 and all(x["awq_loss_vs_rtn"] <= 1 for x in smoothed)  # q,k,v,gate,up x 2
    assert all(x["algorithm"] == "rtn" for x in layers if x["module"].endswith(("o_proj", "down_proj")))
    assert run_cli("verify", out).code == 0
