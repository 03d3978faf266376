"""tfcompile.evaluate: measure an artifact against its reference checkpoint.

`evaluate(model, reference, ...)` runs both on the same tokens and reports
perplexity, KL(ref || model) of the next-token distribution, top-1
agreement, and per-layer output SQNR of every quantized Linear; `check_gates`
and `gate_error` turn thresholds into a pass/fail. See docs/ci.md.

Modules: text (evaluation text -> token rows), models (transformers models;
artifact weights dequantized, activation quantization emulated by hooks),
actquant (the emulation per scheme), kvcache (the FP8 KV cache emulated in
attention, through transformers' AttentionInterface; kvtext: its names and summary line,
without torch), metrics, gates, runner.

`evaluate` and `DTYPES` (runner.py: torch, transformers) load on first use (PEP 562
`__getattr__`), so the CLI's start-up and the report page, which read the gates and
kvtext, do not import torch (tests/cli/test_startup.py).
"""

from __future__ import annotations

from typing import Any

from tfcompile.evaluate.errors import EvalError, GateFailed
from tfcompile.evaluate.gates import GATES, check_gates, gate_error

__all__ = ["evaluate", "check_gates", "gate_error", "GATES", "DTYPES", "EvalError", "GateFailed"]


def __getattr__(name: str) -> Any:
    if name in ("evaluate", "DTYPES"):
        # lazy: the runner imports torch and transformers
        from tfcompile.evaluate import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
