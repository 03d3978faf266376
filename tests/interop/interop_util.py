"""Helpers for the interop tests: read an artifact's tensors back, rebuild
QTensors from them, and build the "our dequantized weights" reference model.

Nothing here re-implements a format: the decode is tfcompile.kernels.formats
(`dequantize`), and the tests compare it with code we did not write
(transformers, compressed-tensors, modelopt).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FORMATS = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block")


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files directly in `directory`."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    files = sorted(Path(directory).glob("*.safetensors"))
    assert files, f"no safetensors in {directory}"
    for f in files:
        out.update(load_file(str(f)))
    return out


def quant_config(directory: Path) -> dict:
    return json.loads((Path(directory) / "config.json").read_text())["quantization_config"]


def quantized_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Modules that carry quantized weights (judged from the stored tensors only)."""
    mods = set()
    for name, t in tensors.items():
        if name.endswith(".weight_packed"):
            mods.add(name[: -len(".weight_packed")])
        elif name.endswith(".weight") and t.dtype == torch.float8_e4m3fn:
            mods.add(name[: -len(".weight")])
    return sorted(mods)


def qtensor_of(tensors: dict[str, torch.Tensor], module: str):
    """Rebuild the QTensor of one Linear from its compressed-tensors tensors."""
    from tfcompile.kernels.formats import QTensor

    m = module
    if f"{m}.weight_packed" in tensors:
        packed, scale = tensors[f"{m}.weight_packed"], tensors[f"{m}.weight_scale"]
        shape = (packed.shape[0], packed.shape[1] * 2)
        if scale.dtype == torch.float8_e4m3fn:  # NVFP4
            return QTensor("nvfp4", packed, scale, tensors[f"{m}.weight_global_scale"].float().reshape(1),
                           shape, "group", None, (16,))
        assert scale.dtype == torch.uint8, scale.dtype
        return QTensor("mxfp4", packed, scale, None, shape, "group", None, (32,))
    data, scale = tensors[f"{m}.weight"], tensors[f"{m}.weight_scale"]
    n, k = data.shape
    if scale.dtype == torch.uint8:  # MXFP8 E8M0
        return QTensor("mxfp8", data, scale, None, (n, k), "group", None, (32,))
    s = scale.float()
    if s.numel() == 1:
        return QTensor("fp8", data, s.reshape(1), None, (n, k), "tensor", None, ())
    if tuple(s.shape) == (n, 1):
        return QTensor("fp8", data, s, None, (n, k), "channel", None, ())
    assert tuple(s.shape) == (-(-n // 128), -(-k // 128)), s.shape
    return QTensor("fp8", data, s, None, (n, k), "block", None, (128, 128))


def our_dequantized_weights(artifact: Path, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """module -> tfcompile's dequantize() of the artifact's tensors, cast to `dtype`."""
    from tfcompile.kernels.formats import dequantize

    t = read_tensors(artifact)
    return {m: dequantize(qtensor_of(t, m), torch.float32).to(dtype) for m in quantized_modules(t)}


def load_reference_model(source: Path, artifact: Path, auto_cls=None, dtype=torch.bfloat16):
    """The *original* model, each quantized Linear's weight replaced by our dequantized one."""
    from transformers import AutoModelForCausalLM

    auto_cls = auto_cls or AutoModelForCausalLM
    model = auto_cls.from_pretrained(str(source), dtype=dtype).eval()
    weights = our_dequantized_weights(artifact, dtype)
    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "")
    for name, w in weights.items():
        mod = modules.get(name)
        if mod is None and prefix and name.startswith(prefix + "."):
            mod = modules.get(name[len(prefix) + 1:])  # bare BertModel vs "bert." names
        assert mod is not None, f"artifact module {name} not in the model"
        assert tuple(mod.weight.shape) == tuple(w.shape), name
        with torch.no_grad():
            mod.weight.copy_(w)
    return model, sorted(weights)


def run_tfcompile(source: Path, out: Path, fmt: str, *extra: str) -> Path:
    """`tfcompile quantize SOURCE -o OUT --format FMT -q [extra]` in-process; asserts exit 0."""
    import contextlib
    import io

    from tfcompile.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["quantize", str(source), "-o", str(out), "--format", fmt, "-q", *extra])
    assert code == 0, f"tfcompile quantize --format {fmt} {' '.join(extra)} exited {code}:\n{err.getvalue()[-3000:]}"
    return out
