"""CUTLASS GEMMs generated as C++ for the model's formats and compiled ahead of time (nvcc).

Templates (templates/*.cu.in) for sm_90a FP8 and sm_100a NVFP4 / MXFP4, the configs they
are built with (configs.py), rendering (render.py), the nvcc toolchain and its compile
cache (toolchain.py, build.py) and the SASS check that the MMA is really there (sass.py).
Emitted by passes/emit_cutlass.py; loaded by tfcompile.runtime.cutlass. docs/kernels.md.
"""

from .configs import KERNELS, CutlassKernel, serving

__all__ = ["KERNELS", "CutlassKernel", "serving"]
