"""tfcompile.evaluate: measure an artifact against its reference checkpoint.

`evaluate(model, reference, ...)` runs both on the same tokens and reports
perplexity, KL(ref || model) of the next-token distribution, top-1
agreement, and per-layer output SQNR of every quantized Linear; `check_gates`
and `gate_error` turn thresholds into a pass/fail. See docs/ci.md.

Modules: text (evaluation text -> token rows), models (transformers models;
artifact weights dequantized, activation quantization emulated by hooks),
actquant (the emulation per scheme), kvcache (the FP8 KV cache emulated in
attention, through transformers' AttentionInterface), metrics, gates, runner.
"""

from tfcompile.evaluate.errors import EvalError, GateFailed
from tfcompile.evaluate.gates import GATES, check_gates, gate_error
from tfcompile.evaluate.runner import DTYPES, evaluate

__all__ = ["evaluate", "check_gates", "gate_error", "GATES", "DTYPES", "EvalError", "GateFailed"]
