"""`load_artifact(path, device)`: an artifact's quantized Linears, ready to run.

On a CUDA device whose target (sm_90a / sm_100a) the artifact has kernels
for (`tfcompile quantize --target`), each QuantLinear launches the artifact's
own cubins; anywhere else it runs the torch emulation with the same API. The
result can be installed into a model built from the artifact's config.json
(`LoadedArtifact.install`), so an evaluation runs through the kernel path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tfcompile.errors import UserError
from tfcompile.runtime.linear import QuantLinear
from tfcompile.schemes import Scheme, get_scheme

BACKENDS = ("auto", "emulated", "cuda")
KERNEL_SOURCES = ("auto", "triton", "cutlass")  # which emitted GEMMs the "cuda" backend runs


@dataclass
class LoadedArtifact:
    path: Path
    scheme: Scheme
    linears: dict[str, QuantLinear]  # module name -> QuantLinear, in manifest order
    backend: str  # "cuda" | "cutlass" | "emulated"
    target: str | None = None  # the kernels' target when backend == "cuda"
    warnings: list[str] = field(default_factory=list)

    def install(self, model: nn.Module) -> list[str]:
        """Swap the model's nn.Linear of each quantized module for its QuantLinear; returns the
        quantized module names the model has no nn.Linear for (e.g. fused MoE experts)."""
        modules = dict(model.named_modules())
        missing = []
        for name, ql in self.linears.items():
            mod = modules.get(name)
            if not isinstance(mod, nn.Linear) or (mod.out_features, mod.in_features) != \
                    (ql.out_features, ql.in_features):
                missing.append(name)
                continue
            parent_name, _, child = name.rpartition(".")
            setattr(modules[parent_name] if parent_name else model, child, ql)
        return missing


def load_artifact(path: str | Path, device: str | torch.device = "cpu", backend: str = "auto",
                  kernels: str = "auto") -> LoadedArtifact:
    """Read every quantized Linear of the artifact at `path` onto `device`.

    backend: "auto" (the artifact's kernels on a CUDA device that runs one of its
    targets, else emulation), "emulated", or "cuda" (an error when impossible).
    kernels: which GEMMs run on CUDA: "triton" (kernels/<target>/), "cutlass"
    (kernels/<target>/cutlass/, runtime/cutlass.py), or "auto" (Triton, as before)."""
    from tfcompile.artifact.verify import load_manifest
    from tfcompile.io.checkpoint import open_checkpoint

    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}", hint="choose one of: " + ", ".join(BACKENDS))
    if kernels not in KERNEL_SOURCES:
        raise UserError(f"unknown kernels {kernels!r}", hint="choose one of: " + ", ".join(KERNEL_SOURCES))
    path, device = Path(path), torch.device(device)
    manifest = load_manifest(path)
    scheme = get_scheme(manifest["scheme"]["name"])
    ckpt = open_checkpoint(path)
    try:
        names = set(ckpt.names())
        linears = {la["module"]: _linear(ckpt, names, scheme, la["module"], *la["shape"]).to(device)
                   for la in manifest.get("layers", [])}
    finally:
        ckpt.close()
    art = LoadedArtifact(path, scheme, linears, "emulated")
    if backend != "emulated" and device.type == "cuda":
        _attach_cuda(art, device, forced=backend == "cuda", kernels=kernels)
    elif backend == "cuda":
        raise UserError(f"backend 'cuda' needs a CUDA device, got {device}", hint="pass device='cuda'")
    return art


def _linear(ckpt, names: set, scheme: Scheme, name: str, n: int, k: int) -> QuantLinear:
    """One QuantLinear from the artifact's tensors (copied out of the memory map)."""
    from tfcompile.evaluate.actquant import STATIC_SCALE
    from tfcompile.evaluate.models import qtensor_of

    q = qtensor_of(ckpt, scheme, name, n, k)
    q = type(q)(q.format, q.data.clone(), q.scale.clone(),
                None if q.global_scale is None else q.global_scale.clone(), q.shape, q.granularity, q.rule,
                q.block)
    suffix = STATIC_SCALE.get(scheme.act or "")
    static = ckpt.get(f"{name}.{suffix}").clone() if suffix else None
    bias = ckpt.get(f"{name}.bias").clone() if f"{name}.bias" in names else None
    return QuantLinear(name, q, scheme.act, static, bias)


def _attach_cuda(art: LoadedArtifact, device: torch.device, forced: bool, kernels: str = "auto") -> None:
    """Use the artifact's kernels for this GPU's target, or say why not (emulation stays)."""
    from tfcompile.tune.hardware import target_of_capability

    why = None
    target = target_of_capability(*torch.cuda.get_device_capability(device)) if torch.cuda.is_available() \
        else None
    index_path = art.path / "kernels" / "index.json"
    if target is None:
        why = "this GPU is not one of the artifact's targets (sm_90a, sm_100a)"
    elif not index_path.is_file():
        why = "the artifact has no kernels (quantize with --target to emit them)"
    elif target not in json.loads(index_path.read_text()).get("targets", {}):
        why = f"the artifact has no kernels for {target}"
    if why is None:
        if kernels == "cutlass":
            from tfcompile.runtime.cutlass import attach
        else:
            from tfcompile.runtime.cuda import attach

        why = attach(art, target, device)
    if why is None:
        art.backend, art.target = ("cutlass" if kernels == "cutlass" else "cuda"), target
        return
    if forced:
        raise UserError(f"cannot run {art.path} with its kernels: {why}", hint="use backend='auto' or 'emulated'")
    art.warnings.append(f"kernels not used, torch emulation instead: {why}")
