"""Activation observers (calibration/observers.py): percentile and mse against independent oracles.

Oracles: numpy.percentile / torch.quantile for percentiles, numpy.histogram for the
re-binned histogram, and the plain-torch reference quantizers of tfcompile.kernels.formats
(quantize_fp8_act / quantize_nvfp4_act(impl="reference") + dequantize) for measured
quantization error. Plumbing: CalibrateConfig errors, Recorders params, the CLI flag.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests_helpers import tensors

from tfcompile.calibration.observers import AbsHistogram, MSEObserver, PercentileObserver, make_observer
from tfcompile.errors import RecipeError
from tfcompile.kernels.formats import (dequantize, dequantize_fp8_act, nvfp4_global_scale, quantize_fp8_act,
                                       quantize_nvfp4_act)


def model(fmt: str):
    """The mse observer's error model of a scheme's static activation scale."""
    from tfcompile.schemes import get_scheme

    return get_scheme(fmt).acts.clip


def feed(obs, x: torch.Tensor, batches: int = 8):
    for part in x.reshape(-1, x.shape[-1]).chunk(batches):
        obs.update(part)
    return obs


def sse(fmt: str, x: torch.Tensor, amax: float) -> float:
    """Measured squared error of quantizing x [T, K] with a static amax (reference quantizers)."""
    x = x.float()
    if fmt == "fp8":
        data, s = quantize_fp8_act(x, "static", scale=torch.tensor([amax / 448.0]))
        xq = dequantize_fp8_act(data, s)
    else:
        xq = dequantize(quantize_nvfp4_act(x, nvfp4_global_scale(torch.tensor([amax])), impl="reference"))
    return float(((xq - x) ** 2).double().sum())


def gaussian_with_outliers(seed: int = 0) -> torch.Tensor:
    """[2048, 256] N(0, 1) with four huge outliers (50-200 sigma), as LLM activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 256, generator=g)
    idx = torch.randperm(x.numel(), generator=g)[:4]
    x.view(-1)[idx] = torch.tensor([200.0, -150.0, 120.0, 50.0])
    return x


# --- percentile -------------------------------------------------------------------------------

@pytest.mark.parametrize("dist", ["normal", "lognormal", "half_zero"])
@pytest.mark.parametrize("p", [50.0, 90.0, 99.0, 99.9, 99.99, 100.0])
def test_percentile_matches_numpy_within_a_bin(dist, p):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 128, generator=g)
    if dist == "lognormal":
        x = torch.exp(2 * x)
    elif dist == "half_zero":
        x[:256] = 0.0
    obs = feed(PercentileObserver(p=p), x)
    for want in (float(np.percentile(x.abs().numpy().astype(np.float64), p)),
                 float(torch.quantile(x.abs().reshape(-1).double(), p / 100))):
        if want == 0:  # the percentile falls among exact zeros: documented fallback to the max
            assert obs.amax() == float(x.abs().max())
        else:
            assert abs(obs.amax() - want) <= obs.hist.width * 1.001


def test_rebinning_as_the_max_grows_equals_one_pass():
    """Batches of growing scale (the range doubles many times) vs one pass over all the data."""
    g = torch.Generator().manual_seed(2)
    parts = [torch.randn(256, 64, generator=g) * 3.0 ** i for i in range(8)]
    stream = PercentileObserver(p=99.0)
    for x in parts:
        stream.update(x)
    allx = torch.cat(parts)
    one = PercentileObserver(p=99.0)
    one.update(allx)
    a = allx.abs().double().numpy().reshape(-1)
    # Exact re-binning: the streamed counts are numpy's histogram over the final range.
    ref, _ = np.histogram(a[a > 0], bins=stream.hist.bins, range=(0.0, stream.hist.hi))
    assert np.abs(stream.hist.counts.numpy() - ref).sum() <= 2  # float rounding at bin edges only
    assert stream.hist.total == one.hist.total == a.size
    assert stream.hist.max == one.hist.max == float(a.max())
    want = float(np.percentile(a, 99.0))
    assert abs(stream.amax() - want) <= stream.hist.width * 1.001
    assert abs(one.amax() - want) <= one.hist.width * 1.001
    assert abs(stream.amax() - one.amax()) <= stream.hist.width + one.hist.width


@settings(max_examples=60)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=300),
       st.floats(0.01, 100.0), st.integers(1, 5))
def test_percentile_property(values, p, batches):
    x = torch.tensor(values, dtype=torch.float32).reshape(-1, 1)
    obs = PercentileObserver(p=p, bins=64)
    for part in x.chunk(batches):
        obs.update(part)
    a = x.abs().double().numpy().reshape(-1)
    amax = obs.amax()
    assert obs.hist.counts.numel() == 64 and obs.hist.total == a.size
    if a.max() == 0:
        assert amax == 0.0
        return
    assert 0 < amax <= a.max() and math.isfinite(amax)
    want = float(np.percentile(a, p))
    if want > 0:
        assert abs(amax - want) <= obs.hist.width * 1.001 + 1e-12


def test_empty_all_zero_and_mostly_zero():
    for kind, kw in [("percentile", {}), ("mse", {"model": model("fp8")}), ("mse", {"model": model("nvfp4")}), ("max", {})]:
        obs = make_observer(kind, **kw)
        assert obs.amax() is None  # nothing seen
        obs.update(torch.zeros(4, 32))
        assert obs.amax() == 0.0  # all zero: Recorders gives the fallback scale
        x = torch.zeros(100, 32)
        x[3, 5] = 2.5  # 1 non-zero element of 3232: every percentile below 99.97 is 0
        obs.update(x)
        a = obs.amax()
        assert a is not None and a > 0 and math.isfinite(a)
    assert make_observer("percentile").amax() is None


def test_non_finite_elements_are_ignored():
    x = torch.randn(64, 32)
    y = x.clone()
    y[0, 0], y[1, 1] = float("nan"), float("inf")
    a, b = PercentileObserver(p=99.0), PercentileObserver(p=99.0)
    a.update(y)
    b.update(y[torch.isfinite(y)])  # the same values without the NaN / Inf
    assert a.amax() == b.amax() and math.isfinite(a.amax())
    c = MSEObserver(model("nvfp4"))
    c.update(y)  # the blocks holding NaN / Inf are dropped
    assert math.isfinite(c.amax()) and c.amax() <= float(x.abs().max())


def test_histogram_state_stays_bounded():
    h = AbsHistogram(256)
    g = torch.Generator().manual_seed(3)
    for i in range(50):
        h.add((torch.rand(1000, generator=g) * 10.0 ** (i % 7)).float())
    assert h.counts.numel() == 256 and h.total == 50_000
    assert h.max <= h.hi < 2 * h.max


# --- mse --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_mse_error_model_matches_measured_error(fmt):
    """The modelled error curve (histogram / block sample) vs reference quantizers on the data."""
    x = torch.distributions.StudentT(3.0).sample((512, 256))
    obs = feed(MSEObserver(model(fmt)), x)
    cands, err = obs.errors()
    for i in (0, 30, 70, 99):
        assert float(err[i]) == pytest.approx(sse(fmt, x, float(cands[i])), rel=0.05)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_mse_on_rare_huge_outliers_beats_max_and_percentile(fmt):
    """For FP8/NVFP4 (floating point: relative precision) clipping a 200-sigma outlier costs far
    more than it gains, so mse stays near the max; percentile clips it and loses."""
    x = gaussian_with_outliers()
    m = float(x.abs().max())
    mse = feed(MSEObserver(model(fmt)), x).amax()
    pct = feed(PercentileObserver(), x).amax()
    assert 0.9 <= mse / m <= 1.0
    assert sse(fmt, x, mse) <= sse(fmt, x, m) * 1.01  # within the observer's 1% tolerance
    assert sse(fmt, x, mse) < 0.2 * sse(fmt, x, pct)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_mse_on_uniform_data_keeps_about_the_max(fmt):
    x = torch.rand(1024, 256) * 2 - 1
    m = float(x.abs().max())
    amax = feed(MSEObserver(model(fmt)), x).amax()
    assert 0.85 <= amax / m <= 1.0
    assert sse(fmt, x, amax) <= sse(fmt, x, m) * 1.01


def test_mse_clips_when_clipping_pays():
    """fp8: 10^4 values at 0.52 x max sit mid-way between E4M3 grid points at scale max/448;
    clipping the one max value by ~3% puts them on the grid (E4M3 0x77 = 240)."""
    x = torch.full((10_000,), 0.52)
    x[0] = 1.0
    x = x.reshape(-1, 16)
    amax = feed(MSEObserver(model("fp8")), x).amax()
    assert amax < 0.99
    assert sse("fp8", x, amax) < 0.5 * sse("fp8", x, 1.0)
    # nvfp4, uniform blocks: block scales of blocks near the max round coarsely in E4M3
    # (384, 416, 448); a global scale ~0.93 x max rounds them better.
    u = torch.rand(2048, 256) * 2 - 1
    a = feed(MSEObserver(model("nvfp4")), u).amax()
    assert a < 0.98 and sse("nvfp4", u, a) < 0.97 * sse("nvfp4", u, float(u.abs().max()))


def test_mse_is_deterministic_and_bounded():
    x = gaussian_with_outliers(seed=5)
    a = feed(MSEObserver(model("nvfp4"), sample_blocks=256), x)
    b = feed(MSEObserver(model("nvfp4"), sample_blocks=256), x)
    assert a.amax() == b.amax()
    rows, w = a.blocks.sample()
    assert rows.shape == (256, 16) and bool((w >= 1).all())
    # the outlier blocks are far above tau: kept, each counted exactly once
    assert (rows.amax(1) >= 50).sum() == 4 and bool((w[rows.amax(1) >= 50] == 1).all())
    small = feed(MSEObserver(model("nvfp4"), sample_blocks=10_000), x[:64])  # fewer blocks than n: exact
    assert bool((small.blocks.sample()[1] == 1).all())


@settings(max_examples=25)
@given(st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=16, max_size=256),
       st.sampled_from(["fp8", "nvfp4"]))
def test_mse_property(values, fmt):
    n = len(values) // 16 * 16
    x = torch.tensor(values[:n], dtype=torch.float32).reshape(-1, 16)
    obs = MSEObserver(model(fmt), ratios=20)
    obs.update(x)
    m = float(x.abs().max())
    a = obs.amax()
    if m == 0:
        assert a == 0.0
    else:
        assert 0.3 * m * (1 - 1e-6) <= a <= m and math.isfinite(a)


def test_observer_param_errors():
    with pytest.raises(ValueError, match="percentile"):
        make_observer("percentile", p=0)
    with pytest.raises(ValueError, match="clip error model"):
        make_observer("mse", model="mxfp4")
    with pytest.raises(ValueError, match="unknown observer"):
        make_observer("kl")


# --- plumbing ---------------------------------------------------------------------------------

def test_recorders_pass_observer_params():
    from tfcompile.calibration.recorders import Recorders

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    rec = Recorders(model, {"0", "1"}, observer="percentile", observer_params={"p": 50.0})
    model(torch.randn(8, 16))
    rec.remove()
    assert all(isinstance(o, PercentileObserver) and o.p == 50.0 for o in rec.observers.values())
    assert set(rec.stats(8, "test").input_amax) == {"0", "1"}


@pytest.mark.parametrize("bad, match", [({"observer": "kl"}, "calibrate.observer"),
                                        ({"percentile": 0.0}, "calibrate.percentile"),
                                        ({"percentile": 100.5}, "calibrate.percentile"),
                                        ({"percentile": float("nan")}, "calibrate.percentile")])
def test_calibrate_config_errors(bad, match):
    from tfcompile.passes.calibrate import CalibrateConfig

    with pytest.raises(RecipeError, match=match) as e:
        CalibrateConfig(**bad)
    assert e.value.hint
    CalibrateConfig(observer="percentile", percentile=100.0)  # 100 is allowed: the max


def test_observer_params_follow_the_scheme():
    from tfcompile.kernels.formats.clip_error import BlockE2M1Clip, TensorE4M3Clip
    from tfcompile.passes.calibrate import CalibrateConfig, observer_params
    from tfcompile.schemes import get_scheme

    assert observer_params(CalibrateConfig(observer="mse"), get_scheme("nvfp4")) == {"model": BlockE2M1Clip(16)}
    assert observer_params(CalibrateConfig(observer="mse"), get_scheme("fp8")) == {"model": TensorE4M3Clip()}
    assert observer_params(CalibrateConfig(observer="percentile", percentile=99.9),
                           get_scheme("fp8")) == {"p": 99.9}
    assert observer_params(CalibrateConfig(), get_scheme("mxfp4")) == {}
    with pytest.raises(RecipeError, match="no static activation scales") as e:
        observer_params(CalibrateConfig(observer="mse"), get_scheme("nvfp4a16"))  # e.g. --kv-cache only
    assert e.value.hint


def test_cli_observer_errors(run_cli):
    res = run_cli("plan", "--format", "fp8", "--set", "calibrate.observer=kl")
    assert res.code == 1 and "calibrate.observer" in res.err and "hint:" in res.err
    res = run_cli("plan", "--format", "fp8", "--set", "calibrate.percentile=0")
    assert res.code == 1 and "hint:" in res.err
    res = run_cli("plan", "--format", "nvfp4a16", "--observer", "mse")  # no calibrate pass to configure
    assert res.code == 1 and "calibrate" in res.err
    res = run_cli("plan", "--format", "nvfp4", "--observer", "mse")
    assert res.code == 0
    cal = [p for p in res.json()["passes"] if p["name"] == "calibrate"][0]["config"]
    assert cal["observer"] == "mse" and cal["percentile"] == 99.99


def test_cli_percentile_reaches_manifest_and_changes_scales(tiny_llama, tmp_path, run_cli):
    calib = ["--set", "calibrate.samples=2", "--set", "calibrate.seq_len=32"]
    scales = {}
    for obs in ("max", "percentile"):
        out = tmp_path / obs
        res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8", "--observer", obs, "-q", *calib)
        assert res.code == 0, res.err
        m = json.loads((out / "tfcompile" / "manifest.json").read_text())
        cal = [p for p in m["recipe"]["passes"] if p["name"] == "calibrate"][0]["config"]
        assert cal["observer"] == obs
        scales[obs] = {k: float(v) for k, v in tensors(out).items() if k.endswith(".input_scale")}
        assert run_cli("verify", out).code == 0
    assert scales["max"].keys() == scales["percentile"].keys() and len(scales["max"]) == 14
    assert all(scales["percentile"][k] <= scales["max"][k] for k in scales["max"])  # clips, never grows
    assert any(scales["percentile"][k] < scales["max"][k] for k in scales["max"])


def test_cli_mse_nvfp4_runs_and_verifies(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "mse"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4", "--observer", "mse", "--json",
                  "--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16")
    assert res.code == 0, res.err
    t = tensors(out)
    g = [float(v) for k, v in t.items() if k.endswith(".input_global_scale")]
    assert len(g) == 14 and all(math.isfinite(v) and v > 0 for v in g)
    assert run_cli("verify", out).code == 0
