"""Triton kernels for every format (activation quantization and GEMMs).

Each kernel is registered in `registry.KERNELS` with what ahead-of-time
emission and tuning need; each has a plain-torch reference built on
`tfcompile.kernels.formats`. Importing this package registers them all.
Kernel list, layouts and targets: docs/kernels.md.
"""

from . import act_quant, fp4_gemm, fp8_gemm, w4a16_gemm  # noqa: F401  (registering)
from .interpret import as_interpreted, as_jit
from .registry import KERNELS, KernelDef, register_kernel

__all__ = ["KERNELS", "KernelDef", "register_kernel", "as_interpreted", "as_jit"]
