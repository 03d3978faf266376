"""A real consumer loads the artifact: transformers 5.24 + compressed-tensors 0.20.1, on CPU.

Reference ("ours"): the *original* tiny Llama loaded by transformers, each
quantized Linear's weight replaced by tfcompile.kernels.formats.dequantize of
the artifact's stored tensors (read back from the safetensors files), cast to
bf16.

What transformers does (see docs/interop.md):
- `from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True))`
  (the replacement for the deprecated `run_compressed=False`) decompresses the
  weights to bf16 at load time and returns a plain dense model: weights only,
  no activation quantization. Tolerance: exact. compressed-tensors decodes in
  fp32 and rounds once to bf16 as we do (test_ct_decompress proves the weights
  bit-identical), and both models then run the same bf16 code on the same
  machine, so any difference at all is a real disagreement.
- `from_pretrained(out)` (default, dequantize=False) keeps the compressed
  tensors, decompresses them on the first forward (status DECOMPRESSED) and
  wraps each Linear's forward with compressed-tensors' QDQ: for schemes with
  `input_activations` (nvfp4, mxfp4, mxfp8, fp8, fp8-dynamic, fp8-block) it
  fake-quantizes the inputs in bf16 arithmetic. Weights are still bit-identical
  to ours; with QDQ switched off (`quantization_enabled=False`) the logits are
  exactly ours; for weight-only schemes they are exactly ours as is.
"""

from __future__ import annotations

import pytest
import torch

from interop_util import FORMATS, load_reference_model, our_dequantized_weights

ACT_QUANT = {"nvfp4", "mxfp4", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"}


@pytest.fixture(scope="session")
def ids():
    return torch.randint(4, 256, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def original_logits(tiny_llama_src, ids):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tiny_llama_src), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        return m(ids).logits


@pytest.fixture(scope="session")
def reference(tiny_llama_src, llama_artifact, ids):
    cache = {}

    def get(fmt):
        if fmt not in cache:
            model, mods = load_reference_model(tiny_llama_src, llama_artifact(fmt))
            assert len(mods) == 14
            with torch.no_grad():
                cache[fmt] = model(ids).logits
        return cache[fmt]

    return get


def _load(path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, **kw).eval()


def _quantized_weights_equal(model, artifact):
    mods = dict(model.named_modules())
    for name, w in our_dequantized_weights(artifact).items():
        got = mods[name].weight
        assert got.dtype == torch.bfloat16 and got.shape == w.shape, name
        assert torch.equal(got, w), (name, int((got != w).sum()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_load_gives_our_weights_and_logits(fmt, llama_artifact, reference, original_logits,
                                                      tiny_llama_src, ids):
    from transformers import CompressedTensorsConfig

    art = llama_artifact(fmt)
    model = _load(art, quantization_config=CompressedTensorsConfig(dequantize=True))
    _quantized_weights_equal(model, art)
    # everything else (embeddings, norms, lm_head) is the original, untouched
    orig = _load(tiny_llama_src).state_dict()
    quantized = {n + ".weight" for n in our_dequantized_weights(art)}
    for k, v in model.state_dict().items():
        if k not in quantized:
            assert torch.equal(v, orig[k]), k
    with torch.no_grad():
        logits = model(ids).logits
    ref = reference(fmt)
    assert torch.equal(logits, ref), (logits.float() - ref.float()).abs().max().item()
    # not vacuous: quantization changed the model's output
    assert not torch.equal(logits, original_logits)


@pytest.mark.parametrize("fmt", FORMATS)
def test_default_load_decompresses_to_our_weights(fmt, llama_artifact, reference, ids):
    from compressed_tensors.quantization import QuantizationStatus

    art = llama_artifact(fmt)
    model = _load(art)
    q = model.model.layers[0].self_attn.q_proj
    assert q.quantization_status == QuantizationStatus.COMPRESSED  # kept compressed until used
    with torch.no_grad():
        logits = model(ids).logits
    assert q.quantization_status == QuantizationStatus.DECOMPRESSED
    _quantized_weights_equal(model, art)
    ref = reference(fmt)
    if fmt in ACT_QUANT:
        # compressed-tensors fake-quantizes the activations: the output moves ...
        assert q.quantization_scheme.input_activations is not None
        assert not torch.equal(logits, ref)
        # ... and without that QDQ it is exactly our weight-only model
        for mod in model.modules():
            if hasattr(mod, "quantization_scheme"):
                mod.quantization_enabled = False
        with torch.no_grad():
            logits = model(ids).logits
    else:
        assert q.quantization_scheme.input_activations is None
    assert torch.equal(logits, ref), (logits.float() - ref.float()).abs().max().item()
