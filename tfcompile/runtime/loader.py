"""`load_artifact(path, device, kernels)`: an artifact's quantized Linears, ready to run.

On a CUDA device whose target (sm_90a / sm_100a) the artifact has kernels
for (`tfcompile quantize --target`), each QuantLinear launches the artifact's
own cubins (or, with kernels="cutlass", its CUTLASS GEMMs); anywhere else it runs
the torch emulation with the same API. The result can be installed into a model
built from the artifact's config.json (`LoadedArtifact.install`), so an
evaluation runs through the kernel path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.naming import qtensor_of, static_input_scale
from tfcompile.errors import UserError
from tfcompile.io.checkpoint import Checkpoint, open_checkpoint
from tfcompile.runtime import cuda, cutlass
from tfcompile.runtime.linear import Kernels, QuantLinear
from tfcompile.schemes import Scheme, get_scheme
from tfcompile.tune.hardware import target_of_capability

ATTACH = {Kernels.TRITON: cuda.attach, Kernels.CUTLASS: cutlass.attach}


@dataclass
class LoadedArtifact:
    path: Path
    scheme: Scheme
    linears: dict[str, QuantLinear]  # module name -> QuantLinear, in manifest order
    kernels: Kernels  # what runs them: TRITON | CUTLASS | EMULATED
    target: str | None = None  # the kernels' target when they run on a GPU
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


def load_artifact(path: str | Path, device: str | torch.device = "cpu", kernels: str | Kernels = "auto",
                  require: bool = False) -> LoadedArtifact:
    """Read every quantized Linear of the artifact at `path` onto `device`.

    kernels (`Kernels`): "auto" (the artifact's Triton kernels on a CUDA device that runs one
    of its targets, else the emulation), "triton" (kernels/<target>/), "cutlass"
    (kernels/<target>/cutlass/, runtime/cutlass.py) or "emulated". When the kernels asked for
    cannot run here, the emulation runs and `warnings` says why; with `require`, that is an
    error instead."""
    try:
        kernels = Kernels(kernels)
    except ValueError:
        raise UserError(f"unknown kernels {kernels!r}",
                        hint="choose one of: " + ", ".join(k.value for k in Kernels)) from None
    path, device = Path(path), torch.device(device)
    manifest = load_manifest(path)
    scheme = get_scheme(manifest["scheme"]["name"])
    if manifest["scheme"].get("online_transform"):  # weights stored as W R (tfcompile/rotate/online.py)
        raise UserError(f"{path}: the weights are stored for an online input transform "
                        f"({manifest['scheme']['online_transform']}), which the runtime's QuantLinear does not apply",
                        hint=f"score it with `tfcompile eval {path}` (it emulates the transform), serve it with vLLM")
    ckpt = open_checkpoint(path)
    try:
        names = set(ckpt.names())
        linears = {la["module"]: _linear(ckpt, names, scheme, la["module"], *la["shape"]).to(device)
                   for la in manifest.get("layers", [])}
    finally:
        ckpt.close()
    art = LoadedArtifact(path, scheme, linears, Kernels.EMULATED)
    if kernels == Kernels.EMULATED:
        return art
    if device.type == "cuda":
        _attach_cuda(art, device, require, Kernels.TRITON if kernels == Kernels.AUTO else kernels)
    elif require:
        raise UserError(f"kernels={kernels.value!r} needs a CUDA device, got {device}",
                        hint="pass device='cuda', or kernels='emulated'")
    return art


def _linear(ckpt: Checkpoint, names: set, scheme: Scheme, name: str, n: int, k: int) -> QuantLinear:
    """One QuantLinear from the artifact's tensors (copied out of the memory map)."""
    q = qtensor_of(ckpt, scheme, name, n, k)
    q = type(q)(q.format, q.data.clone(), q.scale.clone(),
                None if q.global_scale is None else q.global_scale.clone(), q.shape, q.granularity, q.rule,
                q.block)
    static = static_input_scale(ckpt, scheme, name)
    static = static.clone() if static is not None else None
    bias = ckpt.get(f"{name}.bias").clone() if f"{name}.bias" in names else None
    return QuantLinear(name, q, scheme.act, static, bias)


def _attach_cuda(art: LoadedArtifact, device: torch.device, require: bool, kernels: Kernels) -> None:
    """Use the artifact's `kernels` for this GPU's target, or say why not (emulation stays)."""
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
        why = ATTACH[kernels](art, target, device)
    if why is None:
        art.kernels, art.target = kernels, target
        return
    if require:
        raise UserError(f"cannot run {art.path} with its {kernels.value} kernels: {why}",
                        hint="use kernels='auto' or 'emulated', or require=False")
    art.warnings.append(f"kernels not used, torch emulation instead: {why}")
