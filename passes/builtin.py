"""Import every built-in pass module so each registers itself (explicit list)."""

from tfcompile.passes import calibrate, load, manifest, pack, select, verify  # noqa: F401
from tfcompile.passes.quantize import awq, gptq, mse, rtn, smoothquant  # noqa: F401
from tfcompile.passes import evaluate  # noqa: F401  (quantize --eval)
from tfcompile.passes import emit  # noqa: F401,E402  (quantize --target)
from tfcompile.passes import layout  # noqa: F401,E402  (--layout, --tp: passes/layout.py)
from tfcompile.passes import onnx  # noqa: F401,E402  (quantize --export onnx: passes/onnx.py)
from tfcompile.passes import distill  # noqa: F401,E402  (tfcompile distill: passes/distill.py)
from tfcompile.passes import emit_cutlass  # noqa: F401,E402  (CUTLASS kernels: passes/emit_cutlass.py)
from tfcompile.passes import rotate  # noqa: F401,E402  (rotate.*: passes/rotate.py)
from tfcompile.passes import mixed  # noqa: F401,E402  (mixed.*: passes/mixed.py)
from tfcompile.passes import report  # noqa: F401,E402  (quantize --report: passes/report.py)
