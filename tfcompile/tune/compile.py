"""Ahead-of-time compilation of one kernel config with Triton (no GPU needed): the one path.

`compile_kernel` runs triton.compile(ASTSource(fn, signature, constexprs),
target=GPUTarget("cuda", capability, 32)) and returns what the artifact
stores: PTX, cubin and the launch metadata. Emission (tfcompile/tune/emit.py), GPU
measurement (tfcompile/runtime/measure.py, through `triton_compile`) and the
PTX tests (tests/kernels/triton/test_triton_ptx.py) all compile here; the
registry's `signature` / `constexprs` for (N, K, config) go into the ASTSource
and the config's knobs become compile options (kernels/triton/common.py
`compile_options`).

Reproducibility: Triton's output is deterministic for one Triton install,
but by default it embeds line info whose file entries are the absolute paths
of the kernel sources (`.file 1 "/.../kernels/triton/x.py"` in the PTX, and
the same strings in the cubin's debug sections), so an artifact built from
another checkout or site-packages would differ. Compilation therefore runs
with TRITON_DISABLE_LINE_INFO=1 (scoped; part of Triton's cache key), which
drops them. Fp-contraction is requested explicitly (enable_fp_fusion=True,
Triton 3.9's default) so the result does not depend on TRITON_DEFAULT_FP_FUSION.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Mapping

# Triton metadata fields that name files of this machine: dropped from what is stored.
_LOCAL_FIELDS = ("extern_libs",)


@dataclass(frozen=True)
class Compiled:
    ptx: str
    cubin: bytes
    metadata: dict  # Triton's KernelMetadata as JSON-able data (no local paths)
    signature: dict
    constexprs: dict
    options: dict

    @property
    def name(self) -> str:
        return self.metadata["name"]


def jit_fn(fn):
    """The compilable twin of a kernel function (tfcompile.kernels.triton.interpret): a kernel
    decorated while TRITON_INTERPRET=1 was set is an interpreter object that cannot compile."""
    from tfcompile.kernels.triton.interpret import as_jit  # lazy: the kernels package imports triton (~1 s)

    return as_jit(fn)


def jit_language():
    """`tl.*` library functions as JIT functions while compiling (the kernels package's guard
    against interpreter patches left in `triton.language` by CPU launches in this process)."""
    from tfcompile.kernels.triton.interpret import language  # lazy: the kernels package imports triton (~1 s)

    return language("jit")


@contextmanager
def _no_line_info():
    key = "TRITON_DISABLE_LINE_INFO"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def options_of(config: Mapping) -> dict:
    """triton.compile options from a tuning config (knobs that are not constexprs)."""
    from tfcompile.kernels.triton.common import compile_options  # lazy: the kernels package imports triton (~1 s)

    return compile_options(dict(config))


def triton_compile(kdef, n: int, k: int, config: Mapping, capability: int):
    """Triton's CompiledKernel of `kdef` for shape (N, K) with `config` for sm_<capability>(a):
    the registry's signature and constexprs, the config's options, no line info."""
    import triton  # lazy: triton's compiler (~1 s to import) only when something compiles
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(kdef.signature(n, k, dict(config)))
    consts = dict(kdef.constexprs(n, k, dict(config)))
    with _no_line_info(), jit_language():
        return triton.compile(ASTSource(jit_fn(kdef.fn), sig, consts), target=GPUTarget("cuda", capability, 32),
                              options=options_of(config))


def compile_kernel(kdef, n: int, k: int, config: Mapping, capability: int) -> Compiled:
    """Compile `kdef` for shape (N, K) with `config` for sm_<capability>a: what the artifact stores."""
    ck = triton_compile(kdef, n, k, config, capability)
    sig = dict(kdef.signature(n, k, dict(config)))
    consts = dict(kdef.constexprs(n, k, dict(config)))
    return Compiled(ck.asm["ptx"], bytes(ck.asm["cubin"]), portable_metadata(ck.metadata), sig,
                    _jsonable(consts), options_of(config))


def portable_metadata(md) -> dict:
    """KernelMetadata -> JSON-able dict, minus fields naming local files."""
    d = md._asdict() if hasattr(md, "_asdict") else dict(md)
    d = {k: v for k, v in d.items() if k not in _LOCAL_FIELDS}
    return _jsonable(d)


def _jsonable(v: Any) -> Any:
    if hasattr(v, "_asdict"):
        return _jsonable(v._asdict())
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def cache_key(kernel: str, n: int, k: int, config: Mapping, capability: int) -> str:
    """Identity of one compilation (buckets sharing a config share the binary)."""
    return json.dumps([kernel, n, k, capability, dict(config)], sort_keys=True)


class FrontendCheck:
    """Runs Triton's front end (Python AST -> TTIR, ~10-70 ms, no PTX) on a config: where a
    kernel states its constraints (`tl.static_assert`, e.g. "BLOCK_M % 128 == 0"), a config
    breaking them fails here. Memoized per (kernel, N, K, target, constexprs) for one run."""

    def __init__(self):
        self._memo: dict[str, str | None] = {}

    def __call__(self, kdef, n: int, k: int, config: Mapping, capability: int) -> str | None:
        """None when the front end accepts the config, else the reason (one line)."""
        consts = kdef.constexprs(n, k, dict(config))
        key = json.dumps([kdef.name, id(kdef.fn), n, k, capability, _jsonable(consts)], sort_keys=True)
        if key not in self._memo:
            self._memo[key] = self._run(kdef, n, k, config, consts, capability)
        return self._memo[key]

    @staticmethod
    def _run(kdef, n, k, config, consts, capability) -> str | None:
        from triton._C.libtriton import ir  # lazy: triton's compiler (~1 s to import); only to check a config
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", capability, 32)
        backend = make_backend(target)
        opts = backend.parse_options(options_of(config))
        ctx = ir.context()
        ir.load_dialects(ctx)
        backend.load_dialects(ctx)
        try:
            with jit_language():
                ASTSource(jit_fn(kdef.fn), kdef.signature(n, k, dict(config)), consts).make_ir(
                    target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx)
        except Exception as e:  # noqa: BLE001 - CompilationError and friends: the config is out
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
            return f"{type(e).__name__}: {lines[-1] if lines else ''}"
        return None
