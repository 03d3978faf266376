"""`distill.init`: start the student from another artifact's weights (e.g. a GPTQ artifact).

Distillation starts by default from the checkpoint's own weights, i.e. round-to-nearest. With
`--init ARTIFACT` (`--set distill.init=ARTIFACT`), a tfcompile artifact of the same model and
format, every Linear the plan quantizes starts from that artifact's dequantized weight
(`tfcompile.kernels.formats.dequantize` of its stored tensors, float32 [N, K], as `tfcompile
eval` loads it), so a post-training solution (GPTQ's error-compensated rounding) is what the
training refines. The student then fake-quantizes that weight by RTN's rules, as pack will
re-quantize it: a value already on the artifact's grid keeps its code when its block's scale
comes back the same, which holds where the block's largest code is the format's maximum; where
GPTQ rounded a block's largest element down, the recomputed scale is smaller and those codes
move (the run's held-out "before" figures show what the start costs against the artifact).

Only dense Linears named as in the source checkpoint are supported (no rotated artifacts: their
weights live in a rotated basis the unrotated teacher does not share; no fused MoE experts).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from tfcompile.artifact.manifest import MANIFEST, has_manifest, load_manifest
from tfcompile.artifact.naming import layer_scheme, qtensor_of
from tfcompile.errors import RecipeError
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.kernels.formats import dequantize
from tfcompile.schemes import DISTILL_STARTS, get_scheme


def init_path(cfg) -> str:
    """Where the start artifact of DistillConfig `cfg` is: distill.init, or, where that names an
    algorithm (distill.init=gptq), the artifact tfcompile/cli/distill_start.py built for it (the
    distill pass refuses a run without one before any pass runs: passes/distill.py)."""
    return cfg.init_artifact if cfg.init in DISTILL_STARTS else cfg.init


class InitWeights:
    """The dequantized weights of artifact `path`, by module name, read when a Linear is built."""

    def __init__(self, path: Path, scheme_name: str, shapes: dict[str, tuple[int, int]], layers: dict):
        self.path, self.scheme_name, self.shapes, self._layers = path, scheme_name, shapes, layers
        self.manifest_sha256 = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()

    @classmethod
    def open(cls, path: str | Path, plan) -> "InitWeights":
        """Check `path` is an artifact of the plan's format and Linears; raise RecipeError if not."""
        path = Path(path)
        if not has_manifest(path):
            raise RecipeError(f"distill.init {path}: not a tfcompile artifact (no {MANIFEST})",
                              hint="give the output folder of `tfcompile quantize` for this model")
        manifest = load_manifest(path)
        name = manifest["scheme"]["name"]
        if name != plan.scheme.name:
            raise RecipeError(f"distill.init {path}: the artifact is {name}, the run quantizes to "
                              f"{plan.scheme.name}", hint=f"quantize the init artifact with --format {plan.scheme.name}")
        if manifest["scheme"].get("online_transform"):  # quantize.online_hadamard: W R, not W
            raise RecipeError(f"distill.init {path}: the artifact's weights are stored for an online input "
                              "transform; the student's are not", hint="start from an artifact quantized without "
                                                                       "quantize.online_hadamard")
        if manifest.get("rotate"):  # the rotate pass's record (passes/rotate.py)
            raise RecipeError(f"distill.init {path}: the artifact's weights are rotated; the teacher's are not",
                              hint="start from an artifact quantized without rotate.kind")
        layers = {la["module"]: la for la in manifest.get("layers", [])}
        shapes = {t.module: tuple(layers[t.module]["shape"]) if t.module in layers else None
                  for g in plan.groups for t in g.members}
        missing = sorted(m for m, s in shapes.items() if s is None)
        if missing:
            raise RecipeError(f"distill.init {path}: Linear {missing[0]} is not quantized in the artifact "
                              f"({len(missing)} such)", hint="quantize the init artifact from the same model and plan")
        return cls(path, name, shapes, layers)

    def apply(self, model: nn.Module, only: str | None = None) -> int:
        """Copy the artifact's dequantized weights into `model`'s plan Linears (under `only`, when
        given; Linears already converted are skipped). Returns how many were set."""
        scheme = get_scheme(self.scheme_name)
        modules = dict(model.named_modules())
        ckpt = open_checkpoint(self.path)
        done = 0
        try:
            for name, (n, k) in sorted(self.shapes.items()):
                if only is not None and not name.startswith(only):
                    continue
                mod = modules.get(name)
                if type(mod) is not nn.Linear:  # converted already (FakeQuantLinear), or not a dense Linear
                    if mod is None or not hasattr(mod, "spec"):
                        raise RecipeError(f"distill.init {self.path}: {name} is not a dense Linear of the model",
                                          hint="distill.init supports dense Linears (no fused MoE experts)")
                    continue
                if tuple(mod.weight.shape) != (n, k):
                    raise RecipeError(f"distill.init {self.path}: {name} is {n}x{k} in the artifact but "
                                      f"{tuple(mod.weight.shape)} in the model",
                                      hint="quantize the init artifact from the same model")
                w = dequantize(qtensor_of(ckpt, layer_scheme(self._layers[name], scheme), name, n, k), torch.float32)
                with torch.no_grad():
                    mod.weight.copy_(w.to(mod.weight.dtype))
                done += 1
        finally:
            ckpt.close()
        return done
