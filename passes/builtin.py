"""Import every built-in pass module so each registers itself (explicit list, no package walking).

Imported by the entry points (tfcompile.api, hence the CLI); the pipeline core never imports
a pass. The standard pipeline's order is each pass's declared `slot`, not this list's.
"""

from tfcompile.passes import (calibrate, distill, emit, emit_cutlass, evaluate, layout, load,  # noqa: F401
                              manifest, mixed, onnx, pack, report, rotate, select, verify)
from tfcompile.passes.quantize import awq, gptq, mse, quantize, rtn, smoothquant  # noqa: F401
