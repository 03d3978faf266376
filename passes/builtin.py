"""Import every built-in pass module so each registers itself (explicit list, no package walking),
and set the standard pipeline's order: STANDARD, the one list of it.

Imported by the entry points (tfcompile.api, hence the CLI); the pipeline core never imports
a pass. Which of STANDARD a run schedules is each pass's `when` (and other passes' `implies`).
"""

from tfcompile.passes import (calibrate, distill, emit, emit_cutlass, evaluate, layout, load,  # noqa: F401
                              manifest, mixed, onnx, pack, report, rotate, select, verify)
from tfcompile.passes.quantize import awq, gptq, gptq_layer, mse, quantize, rtn, signround, smoothquant  # noqa: F401
from tfcompile.pipeline.passes import set_schedule  # noqa: E402

# The standard pipeline, in order (docs/design.md "Passes declare when they run").
STANDARD = ("load", "rotate", "select", "mixed", "layout", "calibrate", "quantize", "distill", "pack", "emit",
            "onnx", "manifest", "emit_cutlass", "verify", "eval", "report")
set_schedule(STANDARD)
