"""Every family x format: quantize, verify, eval (the CI subset; TFCOMPILE_FAMILY_MATRIX=full for all 64).

The full matrix with the loader checks runs in bench/families.py, whose table is docs/models.md's.
"""

from __future__ import annotations

import json
import math

import pytest

from families_util import manifest, matrix, run_cli


@pytest.mark.parametrize("family,fmt", matrix())
def test_quantize_verify_eval(family, fmt, family_src, family_artifact):
    art = family_artifact(family, fmt)
    m = manifest(art)
    assert m["scheme"]["name"] == fmt and m["family"] == {"kimi_k2": "deepseek_v3", "qwen3_5_moe": "qwen3_5"}.get(
        family, family)
    assert m["summary"]["quantized_linears"] > 0
    code, out, err = run_cli("verify", art, "--json")  # checksums, shapes vs config, scales, shared global scales
    assert code == 0, out + err
    assert all(c["ok"] for c in json.loads(out)["checks"])
    code, out, err = run_cli("eval", art, "--reference", family_src(family), "--max-tokens", "128",
                             "--seq-len", "32", "--json")
    assert code == 0, err
    metrics = json.loads(out)["metrics"]
    assert all(math.isfinite(v) for v in metrics.values())
    # quantization changed the model (not vacuous), and it still predicts like the original
    assert 0 < metrics["kl_mean"] < 0.3, metrics
    assert metrics["top1_agreement"] >= 0.2, metrics  # near-flat logits of a random model: a loose bound
