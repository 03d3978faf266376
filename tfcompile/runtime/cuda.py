"""Launch an artifact's cubins (kernels/<target>/*.cubin) through Triton's driver.

A cubin is loaded as a `triton.compiler.CompiledKernel` from its stored
metadata (the emitted JSON's `triton_metadata`) and the kernel's ASTSource
(signature + constexprs from the JSON; the launcher is generated from them);
nothing is recompiled. Launch: grid = KernelDef.grid(M, N, K, config), the
arguments in the kernel's parameter order (`arg_order`): runtime ones from
runtime/bindings.py, constexprs from the JSON.

Exercised only on a GPU (tests/runtime/test_runtime_cuda.py is skipped without one).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from tfcompile.runtime.bindings import (ACT_BINDERS, FOLLOWUP_BINDERS,
                                        GEMM_BINDERS, has_binder, prepare)
from tfcompile.runtime.linear import Kernels
from tfcompile.tune.compile import jit_fn
from tfcompile.tune.registry import load_kernels
from tfcompile.tune.shapes import bucket_for


class LoadedKernel:
    """One emitted kernel file, loaded (module load happens at the first launch)."""

    def __init__(self, kdef, doc: dict, cubin: bytes):
        from triton.compiler import (  # lazy: triton's compiler and driver (~1 s to import); only on a GPU
            ASTSource, CompiledKernel)

        self.kdef, self.doc = kdef, doc
        sig = {a: doc["signature"][a] for a in doc["arg_order"]}  # the launcher reads it in order
        md = dict(doc["triton_metadata"], extern_libs=[])  # dropped at emission: local paths
        name = md["name"]
        with tempfile.TemporaryDirectory() as d:  # CompiledKernel reads the files in its constructor
            (Path(d) / f"{name}.json").write_text(json.dumps(md))
            (Path(d) / f"{name}.cubin").write_bytes(cubin)
            group = {f"{name}.json": str(Path(d) / f"{name}.json"), f"{name}.cubin": str(Path(d) / f"{name}.cubin")}
            self.compiled = CompiledKernel(ASTSource(jit_fn(kdef.fn), sig, doc["constexprs"]), group, md["hash"])

    def launch(self, m: int, args: dict) -> None:
        d = self.doc
        launch_compiled(self.compiled, self.kdef, d["n"], d["k"], d["config"], d["arg_order"], d["constexprs"],
                        m, args)


def launch_compiled(compiled, kdef, n: int, k: int, config: dict, arg_order, constexprs: dict, m: int,
                    args: dict) -> None:
    """compiled[grid](every parameter in order): runtime args from `args`, constexprs from `constexprs`."""
    grid = tuple(kdef.grid(m, n, k, config))
    grid = grid + (1,) * (3 - len(grid))
    compiled[grid](*[args[a] if a in args else constexprs[a] for a in arg_order])


class KernelStore:
    """The artifact's kernels for one target, loaded on first use and shared by all Linears."""

    def __init__(self, root: Path, target: str, kernels: dict):
        self.root, self.target, self.kernels = root, target, kernels
        index = json.loads((root / "kernels" / "index.json").read_text())
        self.serving = index["targets"][target]
        self.entries = [e for e in index["kernels"] if e["target"] == target]
        self._loaded: dict[str, LoadedKernel] = {}

    def stems(self, kernel: str, n: int, k: int) -> dict[int, str]:
        """M bucket -> file stem of `kernel` for shape (N, K) (N = 0: act-quant)."""
        return {e["m_bucket"]: e["file"] for e in self.entries if e["kernel"] == kernel and e["n"] == n
                and e["k"] == k}

    def get(self, stem: str) -> LoadedKernel:
        if stem not in self._loaded:
            doc = json.loads((self.root / f"{stem}.json").read_text())
            self._loaded[stem] = LoadedKernel(self.kernels[doc["kernel"]], doc,
                                              (self.root / f"{stem}.cubin").read_bytes())
        return self._loaded[stem]


class LinearRunner:
    """y = x @ W^T for one QuantLinear with the artifact's kernels: act-quant (if any), GEMM,
    split-K follow-up (if any); the kernels of the bucket of M."""

    def __init__(self, ql, store: KernelStore, gemm: str, act: str | None):
        self.ql, self.store, self.gemm, self.act = ql, store, gemm, act
        self.w = prepare(ql)
        n, k = ql.out_features, ql.in_features
        self.gemm_stems = store.stems(gemm, n, k)
        self.act_stems = store.stems(act, 0, k) if act else {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.ql.out_features, self.ql.in_features
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k).to(torch.bfloat16).contiguous()
        m = x2.shape[0]
        out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
        if m:
            a, sa = x2, None
            if self.act:
                lk = self.store.get(self.act_stems[bucket_for(m, self.act_stems)])
                args, (a, sa) = ACT_BINDERS[self.act](x2, self.w, lk.doc["config"])
                lk.launch(m, args)
            lk = self.store.get(self.gemm_stems[bucket_for(m, self.gemm_stems)])
            args, ws = GEMM_BINDERS[self.gemm](a, sa, self.w, out, lk.doc["config"])
            lk.launch(m, args)
            if ws is not None:
                follow = self.store.get(lk.doc["followup"]["file"])
                follow.launch(m, FOLLOWUP_BINDERS[follow.doc["kernel"]](ws, out, m))
        y = out.reshape(*lead, n).to(x.dtype)
        return y if self.ql.bias is None else y + self.ql.bias.to(y.dtype)


def attach(art, target: str, device: torch.device) -> str | None:
    """Give each QuantLinear of `art` a LinearRunner; None, or why the kernels cannot be used."""
    kernels, _ = load_kernels()
    store = KernelStore(art.path, target, kernels)
    gemms, acts = store.serving["gemm"], store.serving["act_quant"]
    if not gemms:
        return f"no GEMM kernel serves {art.scheme.name} on {target}"
    gemm, act = gemms[0], (acts[0] if acts else None)
    missing = [kname for kname in (gemm, act) if kname and (kname not in kernels or not has_binder(kname))]
    if missing:
        return f"kernel(s) {missing} are not registered or have no argument binding"
    runners = {}
    for name, ql in art.linears.items():
        r = LinearRunner(ql, store, gemm, act)
        if not r.gemm_stems or (act and not r.act_stems):
            return f"{name}: no emitted kernel for shape {ql.out_features}x{ql.in_features}"
        runners[name] = r
    ensure_allocator()
    for name, ql in art.linears.items():
        ql.runner, ql.kernels = runners[name], Kernels.TRITON
    return None


def ensure_allocator() -> None:
    """Kernels using device-side tensor descriptors (TMA) need Triton's global scratch allocator."""
    import triton  # lazy: triton's compiler and driver (~1 s to import); only on a GPU

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
