"""Run a registered kernel under Triton's CPU interpreter, or compile it, whatever
TRITON_INTERPRET said when the module was imported.

`@triton.jit` decides at decoration time: with TRITON_INTERPRET=1 it returns an
interpreter object (runs on CPU tensors, cannot be compiled), otherwise a
JITFunction (compiles, cannot run on CPU). Setting the variable process-wide in
a test run would therefore change every kernel decorated afterwards --
including the ones the emit pass compiles ahead of time in the same pytest
process -- and the outcome would depend on import order. Instead we build
*twins*: the same Python function (same code object) re-decorated in the other
mode, with every @triton.jit helper it calls through its module globals
replaced by that helper's twin. `as_interpreted(fn)` is what CPU launches and
the CPU tests use; `as_jit(fn)` is what ahead-of-time compilation uses.

Helpers must be called by bare name (`from .common import e4m3_code`), not as
`module.attr`, for the substitution to see them. Triton's own jit-defined
library functions (`tl.max`, `tl.zeros`, `tl.cdiv`, ...) are reached as `tl.*`
attributes, so `language(mode)` swaps those for their twins while a twin runs
or compiles (the interpreter patches `tl` the same way for its builtins);
`launchable(fn)` wraps an interpreter twin so every launch does that.

One interpreter defect is repaired rather than avoided, because kernels cannot
work around it: Triton 3.9's interpreter keeps bf16 tensors as uint16 bit
patterns and `tl.dot` np.matmul's them as integers (garbage). While a twin runs,
`create_dot` first widens bf16 operands to fp32 -- exact, and what a bf16 MMA
with fp32 accumulation computes. A probe decides whether the repair is needed,
so a fixed Triton runs unpatched.
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _ip
from triton.runtime.interpreter import InterpretedFunction, TensorHandle
from triton.runtime.jit import JITFunction

_TWINS: dict[tuple[int, str], object] = {}
_KEEP: list[object] = []  # keep originals alive so ids stay unique


def _raw(fn):
    if isinstance(fn, (JITFunction, InterpretedFunction)):
        return fn.fn
    raise TypeError(f"expected a @triton.jit function, got {type(fn).__name__}")


def _twin(fn, mode: str):
    want = InterpretedFunction if mode == "interp" else JITFunction
    if isinstance(fn, want):
        return fn
    raw = _raw(fn)
    key = (id(raw), mode)
    if key in _TWINS:
        return _TWINS[key]
    g = dict(raw.__globals__)  # a copy: the module's own namespace is never touched
    clone = types.FunctionType(raw.__code__, g, raw.__name__, raw.__defaults__, raw.__closure__)
    clone.__kwdefaults__ = raw.__kwdefaults__
    clone.__module__ = raw.__module__
    clone.__qualname__ = raw.__qualname__
    clone.__doc__ = raw.__doc__
    twin = InterpretedFunction(clone) if mode == "interp" else JITFunction(clone)
    _TWINS[key] = twin  # before recursing: module-level functions refer to each other
    for name, value in list(g.items()):  # then swap every @triton.jit global for its twin
        if isinstance(value, (JITFunction, InterpretedFunction)):
            g[name] = _twin(value, mode)
    _KEEP.append(raw)
    return twin


def as_interpreted(fn):
    """The interpreter twin of a @triton.jit function (itself if already one)."""
    return _twin(fn, "interp")


def as_jit(fn):
    """The compilable JITFunction twin of a @triton.jit function (itself if already one)."""
    return _twin(fn, "jit")


_LANG_MODULES = (tl, tl.standard)

try:  # imported lazily by Triton's launcher; it asserts tl.cdiv is a JITFunction, so
    import triton.experimental.gluon  # noqa: F401  load it now, never while `tl` is patched
except ImportError:  # older Triton without gluon
    pass


@contextlib.contextmanager
def language(mode: str):
    """Within the block, `tl.<fn>` for every jit-defined library function is its
    `mode` twin ("interp" or "jit"); restored on exit. For "interp" the bf16
    `tl.dot` repair (module docstring) is in place too, when needed, and every
    attribute the interpreter patches into `triton.language` is put back on exit:
    Triton 3.9 restores its patches after a grid run but not those it makes for
    nested jit-function calls, which would otherwise leak interpreter builtins
    into `tl.core` and break the next ahead-of-time compilation in the process."""
    snapshot = _snapshot() if mode == "interp" else None
    saved = []
    if mode == "interp" and _needs_bf16_dot_fix():
        saved.append((_ip.InterpreterBuilder, "create_dot", _ip.InterpreterBuilder.create_dot))
        _ip.InterpreterBuilder.create_dot = _fixed_create_dot(_ip.InterpreterBuilder.create_dot)
    for mod in _LANG_MODULES:
        for name, value in list(vars(mod).items()):
            if isinstance(value, (JITFunction, InterpretedFunction)):
                saved.append((mod, name, value))
                setattr(mod, name, _twin(value, mode))
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)
        if snapshot is not None:
            _restore(snapshot)


def _patched_objects() -> tuple:
    """Everything Triton's interpreter patches (`_patch_lang` and helpers)."""
    core = tl.core
    return (tl, core, tl.math, tl.standard, core.tensor, core.tensor_descriptor_base, core.condition, core.dtype)


def _snapshot() -> list:
    return [(obj, dict(vars(obj))) for obj in _patched_objects()]


def _restore(snapshot: list) -> None:
    for obj, attrs in snapshot:
        now = vars(obj)
        for name in [n for n in now if n not in attrs]:
            delattr(obj, name)
        for name, value in attrs.items():
            if now.get(name, _ABSENT) is not value:
                setattr(obj, name, value)


_ABSENT = object()


class _Launchable:
    """`twin[grid](*args)` with the interpreter's view of `tl` in place."""

    def __init__(self, twin):
        self.twin = twin

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            with language("interp"):
                return self.twin[grid](*args, **kwargs)
        return run


def launchable(fn) -> _Launchable:
    """A CPU-launchable interpreter twin: `launchable(kernel)[grid](cpu tensors...)`."""
    return _Launchable(as_interpreted(fn))


def _fixed_create_dot(create_dot):
    def widen(h):
        if h.dtype != tl.bfloat16:
            return h
        return TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def fixed(self, a, b, d, *args, **kwargs):
        return create_dot(self, widen(a), widen(b), d, *args, **kwargs)
    return fixed


_BF16_DOT_BROKEN: bool | None = None


def _needs_bf16_dot_fix() -> bool:
    """Run a 16x16 bf16 tl.dot in the unpatched interpreter once; True if it is wrong."""
    global _BF16_DOT_BROKEN
    if _BF16_DOT_BROKEN is None:
        _BF16_DOT_BROKEN = False  # the probe itself runs unpatched
        a = torch.eye(16, dtype=torch.bfloat16) * 2
        out = torch.zeros(16, 16)
        with language("interp"):
            as_interpreted(_probe_kernel)[(1,)](a, out)
        _BF16_DOT_BROKEN = not torch.equal(out, a.float() @ a.float())
    return _BF16_DOT_BROKEN


def _make_probe():
    @triton.jit
    def _bf16_dot_probe(a_ptr, o_ptr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        tl.store(o_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, a))
    return _bf16_dot_probe


_probe_kernel = _make_probe()
