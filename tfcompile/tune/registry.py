"""Load the Triton kernel registry (tfcompile.kernels.triton.registry.KERNELS).

Kernels register themselves when their module is imported. `load_kernels`
imports every module directly inside the `tfcompile.kernels.triton` package
(one directory listing, not a recursive walk), so tuning and emission pick up
whatever kernels exist, and a module that fails to import is reported as a
warning instead of taking the whole command down (kernels are added while
the rest of the toolchain is in use).

Which kernels serve a scheme on a target is decided here too (`serving`).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Mapping

from tfcompile.schemes import SCHEMES, Scheme

PACKAGE = "tfcompile.kernels.triton"
_SKIP = ("registry",)


def load_kernels() -> tuple[dict, list[str]]:
    """Import the kernel modules; returns (name -> KernelDef, warnings)."""
    from tfcompile.kernels.triton.registry import KERNELS  # lazy: the kernels package imports triton and compiles every kernel's AST (~1 s); only emit/tune need it

    pkg = importlib.import_module(PACKAGE)
    warnings = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name in _SKIP or info.name.startswith(("_", "test")):
            continue
        try:
            importlib.import_module(f"{PACKAGE}.{info.name}")
        except Exception as e:  # noqa: BLE001 - one broken kernel module must not hide the others
            warnings.append(f"kernels: {PACKAGE}.{info.name} failed to import ({type(e).__name__}: {e})")
    return dict(sorted(KERNELS.items())), warnings


def mma_class(kdef, target: str) -> str | None:
    """The tensor-core precision a GEMM kernel runs at on `target` (None: not a GEMM).

    "fp8": every format it serves has FP8 weights (fp8*, mxfp8); "fp4": it serves
    only FP4 formats with quantized activations (W4A4) and the target has FP4
    tensor cores (sm_100a); otherwise "bf16" (weights dequantized in registers)."""
    if kdef.kind != "gemm":
        return None
    schemes = [SCHEMES[f] for f in kdef.formats if f in SCHEMES]
    if schemes and all(s.weights.element == "e4m3" for s in schemes):
        return "fp8"
    if schemes and all(s.packed and s.act for s in schemes) and target == "sm_100a":
        return "fp4"
    return "bf16"


def wanted_class(scheme: Scheme, target: str) -> str:
    """The MMA precision that runs `scheme` as specified on `target`.

    FP8 activations -> fp8; FP4 activations -> fp4 on sm_100a, and on sm_90a (no
    FP4 tensor cores) bf16: W4A16, activations left unquantized, as vLLM's Marlin
    path runs NVFP4/MXFP4 on Hopper; weight-only schemes -> bf16."""
    if scheme.act is None:
        return "bf16"
    if scheme.weights.element == "e4m3":
        return "fp8"
    return "fp4" if target == "sm_100a" else "bf16"


@dataclass(frozen=True)
class Serving:
    """The kernels that run one scheme on one target."""
    gemm: tuple[str, ...]  # GEMM kernels (all tuned and emitted; the runtime picks the fastest)
    act_quant: tuple[str, ...]  # activation-quantization kernels run before them
    note: str = ""  # how the scheme runs when not as specified (weight-only), or why nothing serves
    warn: bool = False  # the note is a problem (a missing kernel), not a design choice


def serving(scheme: Scheme, target: str, kernels: Mapping) -> Serving:
    """GEMMs of the wanted MMA class for (scheme, target); else bf16 (weight-only) GEMMs
    registered for the scheme or for its weight-only twin (same weights, bf16 activations:
    nvfp4 -> nvfp4a16); activation-quant kernels when the chosen GEMMs take quantized activations."""
    fits = [k for k in kernels.values() if scheme.name in k.formats and target in k.targets]
    want = wanted_class(scheme, target)
    gemms = [k.name for k in fits if mma_class(k, target) == want]
    if gemms:
        acts = [k.name for k in fits if k.kind == "act_quant"] if want != "bf16" else []  # quantized activations
        return Serving(tuple(sorted(gemms)), tuple(sorted(acts)))
    twins = {scheme.name} | {s.name for s in SCHEMES.values() if s.act is None and s.weight == scheme.weight
                             and s.granularity == scheme.granularity and s.block == scheme.block}
    gemms = sorted(k.name for k in kernels.values() if target in k.targets and mma_class(k, target) == "bf16"
                   and twins & set(k.formats))
    if not gemms:
        return Serving((), (), f"no GEMM kernel is registered for {scheme.name} on {target}", True)
    if scheme.act is None:
        return Serving(tuple(gemms), ())
    by_design = want == "bf16"  # FP4 activations on a target without FP4 tensor cores
    why = "no FP4 tensor cores" if by_design else f"no {want} GEMM kernel is registered"
    return Serving(tuple(gemms), (), f"{scheme.name} runs weight-only on {target} ({why}): activations "
                   f"are not quantized", not by_design)
