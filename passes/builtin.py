"""Import every built-in pass module so each registers itself (explicit list)."""

from tfcompile.passes import calibrate, load, manifest, pack, select, verify  # noqa: F401
from tfcompile.passes.quantize import gptq, mse, rtn  # noqa: F401
