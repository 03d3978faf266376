"""The MTP layers are calibrated on what the engine feeds them (tfcompile/draft/mtp_calibrate.py):
the target's final normed hidden states, paired with the next token, as vLLM 0.32's EagleProposer
runs the layer at prefill.

- the static input scales of the MTP decoder layer's Linears equal an independent computation:
  the target run by transformers in float32, the MTP layer by hand from the raw tensors
  (tests/draft/mtp_oracle.py), max |x| at each Linear's input over the same calibration ids
  (`--calib random`: torch.randint with the seed's generator), in both calibration loops;
- no MTP Linear takes the fallback amax any more, and GPTQ solves the MTP groups (none is left
  round-to-nearest for want of a Hessian), the output-error scale search scores them.
"""

from __future__ import annotations

import json

import pytest
import torch
from mtp_oracle import mtp_linear_amax

SAMPLES, SEQ_LEN = 2, 16
NVFP4_MAX = 448.0 * 6.0  # input_global_scale = 448 * 6 / amax (calibration/observers.py)


def _quantize(src, out, *args) -> dict:
    """`tfcompile quantize --json` in-process -> its JSON document."""
    import contextlib
    import io

    from tfcompile.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["quantize", str(src), "-o", str(out), "--json", "-q", "--calib", "random",
                   "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ_LEN), *args])
    assert rc == 0
    return json.loads(buf.getvalue())


def _input_global_scales(out) -> dict[str, float]:
    from safetensors import safe_open

    got = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            got.update({k[: -len(".input_global_scale")]: float(st.get_tensor(k)) for k in st.keys()
                        if k.endswith(".input_global_scale")})
    return got


@pytest.mark.parametrize("family,mode", [("deepseek_v32", "sequential"), ("deepseek_v32", "whole"),
                                         ("qwen3_5", "sequential")])
def test_mtp_input_scales_equal_an_independent_computation(family, mode, random_mtp, tmp_path):
    src = random_mtp(family)
    _quantize(src, tmp_path / "out", "--format", "nvfp4", "--set", f"calibrate.mode={mode}",
              "--set", "calibrate.dtype=float32", "--set", "quantize.scale_search=none")
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    ids = torch.randint(0, vocab, (SAMPLES, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    want = mtp_linear_amax(src, ids)
    got = _input_global_scales(tmp_path / "out")
    checked = [m for m in want if m in got]  # the quantized ones (kept projections have no scale)
    assert len(checked) >= 4, (sorted(want), sorted(got))
    for m in checked:
        assert got[m] == pytest.approx(NVFP4_MAX / want[m], rel=1e-4), m


def test_gptq_solves_the_mtp_layer_and_the_search_scores_it(random_mtp, tmp_path):
    """Before: every MTP Linear stayed RTN under GPTQ ("no Hessian") and kept max-based scales under the
    search. Now none is left for want of a Hessian, and each MTP Linear records the search's choice."""
    src = random_mtp("qwen3_5")  # a dense MTP layer: every group sees every token
    doc = _quantize(src, tmp_path / "gptq", "--format", "nvfp4a16", "--algorithm", "gptq")
    assert doc["passes"]["calibrate"]["mtp_modules"] == 7
    assert doc["passes"]["quantize"]["rtn_no_hessian"] == 0
    _quantize(src, tmp_path / "rtn", "--format", "nvfp4", "--set", "quantize.scale_search=output")
    manifest = json.loads((tmp_path / "rtn" / "tfcompile" / "manifest.json").read_text())
    mtp = [la for la in manifest["layers"] if la["module"].startswith("mtp.")]
    assert len(mtp) == 7 and all("scale_search" in la for la in mtp), mtp
