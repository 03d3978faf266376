"""What the exporter reads from an artifact, and every check made before a byte is written.

`ArtifactView` is the artifact as the graph builder needs it: config.json,
the scheme, each quantized Linear's [N, K] and the KV-cache modules. It comes
from the manifest (`tfcompile export-onnx ARTIFACT`) or from the pipeline's
context (the `onnx` pass, before the manifest exists). `check_exportable`
rejects, with a hint, what the graph cannot express: an architecture other
than the Llama family, FP8 128x128 weight blocks, K not divisible by the
block, FP4 below opset 23, MoE experts, sliding-window attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from tfcompile.artifact.manifest import MANIFEST, load_manifest
from tfcompile.io.bounded import load_json
from tfcompile.onnx_export.config import MIN_OPSET_FP4, OnnxExportError
from tfcompile.schemes import Scheme, get_scheme

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ArtifactView:
    path: Path  # artifact (or staging) directory holding config.json and the safetensors
    config: Mapping[str, Any]  # config.json
    scheme: Scheme | None  # None: a plain bf16/fp16/fp32 checkpoint (the float baseline graph)
    layers: Mapping[str, tuple[int, int]]  # quantized Linear -> (N, K)
    kv_modules: tuple[str, ...] = ()  # attention modules with FP8 KV-cache k_scale / v_scale


def view_from_path(path: Path) -> ArtifactView:
    """The view of a published artifact (its tfcompile/manifest.json and config.json), or of a
    plain Hugging Face checkpoint (no quantization: every Linear exported as stored)."""
    path = Path(path)
    if not path.is_dir():
        raise OnnxExportError(f"{path} is not a directory",
                              hint="pass the artifact directory `tfcompile quantize -o` wrote")
    if not (path / MANIFEST).is_file():
        cfg = read_config(path)
        if "quantization_config" in cfg:
            raise OnnxExportError(f"{path} has a quantization_config but no {MANIFEST}: it is quantized, "
                                  "but not by tfcompile", hint="export an artifact written by `tfcompile "
                                  "quantize`, or a bf16/fp16/fp32 checkpoint")
        return ArtifactView(path, cfg, None, {})
    doc = load_manifest(path)  # VerifyError (a UserError) for a damaged manifest
    if doc["scheme"].get("online_transform"):  # quantize.online_hadamard: W R stored, x R left to the engine
        raise OnnxExportError(f"{path}: the weights are stored for an online input transform "
                              f"({doc['scheme']['online_transform']}) the ONNX graph would not apply",
                              hint="export an artifact quantized without quantize.online_hadamard")
    layers = {la["module"]: (int(la["shape"][0]), int(la["shape"][1])) for la in doc.get("layers", [])}
    return ArtifactView(path, read_config(path), get_scheme(doc["scheme"]["name"]), layers,
                        tuple(doc.get("kv_modules", [])))


def read_config(path: Path) -> dict:
    # a regular file, bounded, never a FIFO (io/bounded.py)
    cfg = load_json(Path(path) / "config.json", "config.json", OnnxExportError,
                    hint=f"check the artifact with `tfcompile verify {path}`")
    if not isinstance(cfg, dict):
        raise OnnxExportError(f"{path}/config.json is not a JSON object", hint="rebuild the artifact")
    return cfg


def check_exportable(view: ArtifactView, opset: int) -> None:
    """Raise OnnxExportError (exit 1, with a hint) for anything the graph cannot express."""
    _check_architecture(view)
    if view.scheme is None:
        return
    check_scheme(view.scheme, opset)
    block = view.scheme.k_multiple  # elements per scale along K (1: FP8's per-tensor/channel scales)
    for m, (n, k) in sorted(view.layers.items()):
        if ".experts." in m:
            raise OnnxExportError(f"{m}: MoE experts are not exported to ONNX",
                                  hint="export a dense model, or quantize with --ignore 're:.*experts.*'")
        if k % block:
            raise OnnxExportError(
                f"{m}: K={k} is not a multiple of the {view.scheme.weight} block size {block}; "
                f"DequantizeLinear's block_size must tile K exactly", hint=f"quantize with --ignore '{m}' "
                "to keep this Linear in the model dtype, or use an fp8 format")


def check_scheme(scheme: Scheme, opset: int) -> None:
    if len(scheme.block) > 1:  # 2-D (N, K) weight blocks
        raise OnnxExportError(
            f"format {scheme.name}: 128x128 weight blocks (and dynamic 1x128 activation groups) cannot be "
            "expressed in ONNX: DequantizeLinear's block_size blocks one axis only",
            hint="export an fp8, fp8-dynamic, mxfp8, nvfp4 or mxfp4 artifact instead")
    if scheme.packed and opset < MIN_OPSET_FP4:
        raise OnnxExportError(f"format {scheme.name} stores FLOAT4E2M1 weights, which need opset "
                              f">= {MIN_OPSET_FP4}; --opset {opset} was given",
                              hint=f"use --opset {MIN_OPSET_FP4} (the default) or newer")


def _check_architecture(view: ArtifactView) -> None:
    cfg, path = view.config, view.path
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise OnnxExportError(f"{path}: architecture {arch!r} is not exported to ONNX",
                              hint="supported: " + ", ".join(ARCHITECTURES) + " (decoder-only, Llama family)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise OnnxExportError(f"{path}: hidden_act {cfg.get('hidden_act')!r} is not supported",
                              hint="the exporter builds SiLU-gated MLPs (Llama family)")
    sliding = cfg.get("use_sliding_window") or (arch == "MistralForCausalLM" and cfg.get("sliding_window"))
    if sliding or "sliding_attention" in (cfg.get("layer_types") or []):
        raise OnnxExportError(f"{path}: sliding-window attention is not exported",
                              hint="the graph attends over the whole sequence; export a model without "
                                   "a sliding window (sliding_window: null)")


def kv_strategy(config: Mapping[str, Any]) -> str | None:
    """'tensor' or 'attn_head' for an FP8 KV cache (config.json kv_cache_scheme), else None."""
    qc = config.get("quantization_config") or {}
    scheme = qc.get("kv_cache_scheme")
    return scheme.get("strategy") if isinstance(scheme, dict) else None


class Tensors:
    """The artifact's tensors by name; remembers which were used so none is silently dropped."""

    def __init__(self, ckpt):
        self.ckpt = ckpt
        self.names = frozenset(ckpt.names())
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str) -> torch.Tensor:
        self.used.add(name)
        return self.ckpt.get(name)

    def release(self) -> None:
        """Drop the mapped pages read so far from the resident set (streaming: one layer at a time)."""
        self.ckpt.release()

    def check_all_used(self, path: Path) -> None:
        left = sorted(self.names - self.used)
        if left:
            raise OnnxExportError(f"{path}: tensor {left[0]} has no place in the exported graph "
                                  f"({len(left)} such tensors)",
                                  hint="the exporter covers the Llama family (q/k/v/o, gate/up/down, "
                                       "norms, embeddings, lm_head); this checkpoint has more")
