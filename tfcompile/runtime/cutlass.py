"""Run an artifact's CUTLASS GEMMs (kernels/<target>/cutlass/*.so) through their C entry points.

Each compiled source is a shared object with `<prefix>_run`, `_workspace_size`,
`_can_implement`, `_config` and `_last_cuda_error` (kernels/cutlass/templates/entry.cu.in;
names and ABI in the source's JSON). It is loaded with ctypes (RTLD_LOCAL: the objects'
statically linked CUDA runtimes and CUTLASS symbols never meet) and called with raw
device pointers and torch's current stream, so launches are asynchronous and ordered
with torch's work like any other kernel.

A Linear runs: the artifact's Triton activation-quantization kernel (kernels/<target>/,
written by `emit` -- the CUTLASS GEMMs take quantized operands), then the CUTLASS GEMM of
the M bucket, writing bf16 [M, N]. The weight operands are the artifact's tensors in the
layouts runtime/bindings.py prepares (FP8 scales in fp32; FP4 block scales in the
Blackwell 128x4 layout); NVFP4's tensor scales become the epilogue's alpha, computed once.

Exercised only on a GPU (tests/cutlass/test_cutlass_gpu.py is skipped without one).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import torch

from tfcompile.errors import TfcompileError
from tfcompile.runtime.bindings import ACT_BINDERS, prepare
from tfcompile.runtime.cuda import KernelStore, ensure_allocator
from tfcompile.runtime.linear import Kernels
from tfcompile.tune.registry import load_kernels
from tfcompile.tune.shapes import bucket_for


class CutlassLaunchError(TfcompileError):
    """A CUTLASS entry point returned an error code (exit 2)."""


class CutlassLibrary:
    """One compiled CUTLASS source, loaded."""

    def __init__(self, path: Path, doc: dict):
        self.path, self.doc = Path(path), doc
        self.lib = ctypes.CDLL(str(self.path))  # default mode: RTLD_LOCAL
        e = doc["entry"]
        p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        self._run = getattr(self.lib, e["run"])
        self._run.argtypes = [p, p, p, p, p, p, i, i, i, i, p, sz, p]
        self._run.restype = i
        self._workspace_size = getattr(self.lib, e["workspace_size"])
        self._workspace_size.argtypes, self._workspace_size.restype = [i, i, i, i], sz
        self._can = getattr(self.lib, e["can_implement"])
        self._can.argtypes, self._can.restype = [i, i, i, i], i
        self._last_error = getattr(self.lib, e["last_cuda_error"])
        self._last_error.restype = i
        self._config = getattr(self.lib, e["config"])
        self._config.restype = ctypes.c_char_p
        self._ws: dict[tuple, torch.Tensor] = {}  # (device, bytes) -> workspace

    def config(self) -> dict:
        """The config compiled into the library (equals doc["config"])."""
        return json.loads(self._config().decode())

    def can_implement(self, m: int, n: int, k: int, flags: int = 0) -> bool:
        return bool(self._can(m, n, k, flags))

    def workspace(self, m: int, n: int, k: int, flags: int, device: torch.device) -> torch.Tensor | None:
        size = int(self._workspace_size(m, n, k, flags))
        if size == 0:
            return None
        key = (device, size)
        if key not in self._ws:
            self._ws[key] = torch.empty(size, dtype=torch.uint8, device=device)
        return self._ws[key]

    def gemm(self, a, b, sa, sb, alpha, out: torch.Tensor, m: int, n: int, k: int, flags: int = 0) -> None:
        """out[M, N] = epilogue(a @ b^T) on torch's current stream; tensors on one CUDA device."""
        if not out.is_cuda:
            raise CutlassLaunchError(f"{self.path.name}: the CUTLASS GEMMs run on CUDA tensors, got {out.device}",
                                     hint="move the operands to the GPU, or use the emulated backend on CPU")
        ws = self.workspace(m, n, k, flags, out.device)
        ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
        stream = ctypes.c_void_p(torch.cuda.current_stream(out.device).cuda_stream)
        rc = self._run(ptr(a), ptr(b), ptr(sa), ptr(sb), ptr(alpha), ptr(out), m, n, k, flags, ptr(ws),
                       0 if ws is None else ws.numel(), stream)
        if rc != 0:
            why = self.doc["abi"]["returns"].get(str(rc), "?")
            raise CutlassLaunchError(f"{self.path.name}: run(M={m}, N={n}, K={k}) returned {rc} ({why}), "
                                     f"CUDA error {self._last_error()}",
                                     hint="check shapes and alignment (K % 32, N % 8); run the "
                                          "Triton kernels with kernels='triton'")


class CutlassStore:
    """The artifact's CUTLASS libraries for one target (loaded on first use, shared)."""

    def __init__(self, root: Path, target: str):
        self.root, self.target = Path(root), target
        self.index = json.loads((self.root / "kernels" / target / "cutlass" / "index.json").read_text())
        self._loaded: dict[str, CutlassLibrary] = {}

    def stems(self, kernel: str, n: int, k: int) -> dict[int, str]:
        """M bucket -> file stem of `kernel`'s source chosen for shape (N, K)."""
        return {r["m_bucket"]: r["file"] for r in self.index["problems"] if r["kernel"] == kernel
                and (r["n"], r["k"]) == (n, k)}

    def get(self, stem: str) -> CutlassLibrary:
        if stem not in self._loaded:
            doc = json.loads((self.root / f"{stem}.json").read_text())
            if not doc["compiled"]:
                raise CutlassLaunchError(f"{stem}: not compiled ({doc['why_not']})",
                                         hint="re-emit on a machine with nvcc 12.8+ and nvidia-cutlass")
            self._loaded[stem] = CutlassLibrary(self.root / f"{stem}.so", doc)
        return self._loaded[stem]


def _fp8(doc: dict) -> bool:
    return any(f.startswith("fp8") for f in doc["formats"])


def gemm_operands(w, kernel_doc: dict) -> tuple:
    """(b, sb, alpha, flags bit 1) of a Linear's weights for a CUTLASS GEMM (bindings.Weights)."""
    if _fp8(kernel_doc):  # sm_90a FP8: scales in the epilogue
        return w.data, w.scale.reshape(-1), None, 2 if w.scale.numel() > 1 else 0
    alpha = torch.ones(1, dtype=torch.float32, device=w.data.device)
    if w.static is not None:  # NVFP4 W4A4: y = acc / (input_global_scale * weight_global_scale)
        alpha = (1.0 / (w.static.float() * w.global_scale.float())).reshape(1).contiguous()
    return w.data, w.swizzled, alpha, 0


class CutlassRunner:
    """y = x @ W^T for one QuantLinear: the artifact's Triton act-quant kernel, then the CUTLASS
    GEMM of the bucket of M (bf16 out)."""

    def __init__(self, ql, store: CutlassStore, gemm: str, triton_store, act: str):
        self.ql, self.store, self.gemm, self.tstore, self.act = ql, store, gemm, triton_store, act
        self.w = prepare(ql)
        n, k = ql.out_features, ql.in_features
        self.gemm_stems = store.stems(gemm, n, k)
        self.act_stems = triton_store.stems(act, 0, k)
        self._weights: dict[str, tuple] = {}  # stem -> gemm_operands (alpha computed once)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.ql.out_features, self.ql.in_features
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k).to(torch.bfloat16).contiguous()
        m = x2.shape[0]
        out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
        if m:
            lk = self.tstore.get(self.act_stems[bucket_for(m, self.act_stems)])
            args, (a, sa) = ACT_BINDERS[self.act](x2, self.w, lk.doc["config"])
            lk.launch(m, args)
            stem = self.gemm_stems[bucket_for(m, self.gemm_stems)]
            lib = self.store.get(stem)
            if stem not in self._weights:
                self._weights[stem] = gemm_operands(self.w, lib.doc)
            b, sb, alpha, flags = self._weights[stem]
            if _fp8(lib.doc):
                flags |= 1 if sa.numel() > 1 else 0  # per-token activation scales
            lib.gemm(a, b, sa, sb, alpha, out, m, n, k, flags)
        y = out.reshape(*lead, n).to(x.dtype)
        return y if self.ql.bias is None else y + self.ql.bias.to(y.dtype)


def attach(art, target: str, device: torch.device) -> str | None:
    """Give each QuantLinear of `art` a CutlassRunner; None, or why the CUTLASS kernels cannot be used."""
    if not (art.path / "kernels" / target / "cutlass" / "index.json").is_file():
        return f"the artifact has no CUTLASS kernels for {target} (quantize with --target TARGET --cutlass auto)"
    store = CutlassStore(art.path, target)
    if not store.index["compiled"]:
        return f"its CUTLASS sources were not compiled ({store.index['why_not']})"
    if not store.index["kernels"]:
        return store.index["note"] or f"no CUTLASS GEMM serves {art.scheme.name} on {target}"
    if not (art.path / "kernels" / "index.json").is_file():
        return "the CUTLASS GEMMs need the Triton activation-quantization kernels: also pass --target"
    tstore = KernelStore(art.path, target, load_kernels()[0])
    acts = tstore.serving["act_quant"]
    if not acts:
        return f"no activation-quantization kernel for {art.scheme.name} on {target} in the artifact"
    gemm = store.index["kernels"][0]
    runners = {}
    for name, ql in art.linears.items():
        r = CutlassRunner(ql, store, gemm, tstore, acts[0])
        if not r.gemm_stems or not r.act_stems:
            return f"{name}: no emitted kernel for shape {ql.out_features}x{ql.in_features}"
        runners[name] = r
    ensure_allocator()
    for name, ql in art.linears.items():
        ql.runner, ql.kernels = runners[name], Kernels.CUTLASS
    return None
