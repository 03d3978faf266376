"""Measuring configs on the local GPU (the `measured` entries of the tuning table).

Each of a problem's best ranked configs (search.KEEP_MEASURED) is compiled for
this GPU (tfcompile/tune/compile.py, the one compile path) and timed with
triton.testing.do_bench (median of ~100 ms of launches, after warm-up) on
synthetic operands of the problem's shape (runtime/bindings.py: random valid
codes in the kernel's layouts). GEMMs are timed alone, activation-quant
kernels alone; a split-K GEMM includes its follow-up reduction. Runs only where
torch sees a CUDA GPU of one of the targets: `gpu_measurer` gives `tfcompile tune`
(tfcompile/tune/run.py) a `Measurer` for it, or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tfcompile.errors import UserError
from tfcompile.runtime.bindings import A_OPERANDS, ACT_BINDERS, FOLLOWUP_BINDERS, GEMM_BINDERS, synthetic_weights
from tfcompile.runtime.cuda import ensure_allocator, launch_compiled
from tfcompile.schemes import get_scheme
from tfcompile.tune.compile import triton_compile
from tfcompile.tune.hardware import target_of_capability
from tfcompile.tune.registry import load_kernels
from tfcompile.tune.search import Choice
from tfcompile.tune.shapes import Problem


def local_target() -> tuple[str | None, str | None]:
    """(target of this machine's GPU, None) or (None, why there is none)."""
    if not torch.cuda.is_available():
        return None, "no CUDA GPU is visible"
    cap = torch.cuda.get_device_capability()
    target = target_of_capability(*cap)
    return (target, None) if target else (None, f"GPU of compute capability {cap[0]}.{cap[1]} is not a target")


@dataclass(frozen=True)
class Measurer:
    """Times ranked configs on this machine's GPU, whose target is `target`."""
    target: str

    def __call__(self, kdef, c: Choice) -> tuple[list[tuple[dict, float]], str]:
        return measure_choice(kdef, c)


def gpu_measurer(targets: tuple[str, ...], measure: bool | None) -> Measurer | None:
    """The measurer of the local GPU when asked (True) or by default (None) and its target is one
    of `targets`; None otherwise (the cost model ranks). measure=True without one is an error."""
    if measure is False:
        return None
    target, why = local_target()
    if target is None or target not in targets:
        if measure:
            raise UserError(f"cannot measure: {why or f'this GPU runs {target}, not one of {list(targets)}'}",
                            hint="drop --measure to rank configs with the cost model")
        return None
    return Measurer(target)


def measure_choice(kdef, c: Choice) -> tuple[list[tuple[dict, float]], str]:
    """Time every ranked config of `c`; returns ((config, median us) fastest first, device name).
    Configs that fail to compile or launch are left out; [] when the kernel cannot be timed."""
    device = torch.cuda.get_device_name()
    try:
        make = runner_factory(kdef, c.problem)
    except KeyError:  # no argument binding for this kernel: leave it to the cost model
        return [], device
    times = []
    for r in c.ranked:
        try:
            times.append((r.config, time_us(make(r.config))))
        except Exception:  # noqa: BLE001 - a config the GPU rejects (resources) is just not a candidate
            continue
    times.sort(key=lambda t: t[1])
    return times, device


def time_us(fn: Callable[[], None]) -> float:
    import triton.testing  # lazy: triton's benchmarking helpers, only on a GPU

    fn()  # compile-free warm launch (module load)
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def runner_factory(kdef, p: Problem) -> Callable[[dict], Callable[[], None]]:
    """config -> a closure launching `kdef` on synthetic operands of problem `p` (CUDA)."""
    dev = torch.device("cuda")
    scheme = get_scheme(kdef.formats[0])
    w = synthetic_weights(scheme, max(p.n, 1), p.k, dev)
    if kdef.kind == "act_quant":
        bind, x = ACT_BINDERS[kdef.name], torch.randn(p.m, p.k, device=dev, dtype=torch.bfloat16)
        return lambda cfg: _closure(kdef, p, cfg, bind(x, w, cfg)[0])
    a, sa = A_OPERANDS[kdef.name](p.m, p.k, dev)
    out = torch.empty(p.m, p.n, dtype=torch.bfloat16, device=dev)
    bind = GEMM_BINDERS[kdef.name]

    def make(cfg: dict) -> Callable[[], None]:
        args, ws = bind(a, sa, w, out, cfg)
        main = _closure(kdef, p, cfg, args)
        if ws is None:
            return main
        fdef = load_kernels()[0][kdef.followup]
        fcfg = {**fdef.default_config, "SPLIT_K": int(cfg["SPLIT_K"])}
        follow = _closure(fdef, p, fcfg, FOLLOWUP_BINDERS[fdef.name](ws, out, p.m))
        return lambda: (main(), follow())
    return make


def _closure(kdef, p: Problem, cfg: dict, args: dict) -> Callable[[], None]:
    """Compile `kdef` for this GPU with `cfg` and return a launcher of it on `args`."""
    major, minor = torch.cuda.get_device_capability()
    sig, consts = kdef.signature(p.n, p.k, cfg), kdef.constexprs(p.n, p.k, cfg)
    ck = triton_compile(kdef, p.n, p.k, cfg, major * 10 + minor)
    ensure_allocator()
    return lambda: launch_compiled(ck, kdef, p.n, p.k, cfg, list(sig), consts, p.m, args)
