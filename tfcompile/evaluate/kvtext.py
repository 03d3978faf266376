"""The KV-cache emulation's names and its one line for people, and the lens's position limit,
without torch.

kvcache.py (the emulation itself, torch) re-exports these; the CLI's `--kv-cache` choice and the
report page read them from here, so neither imports torch to build its help or its page.
"""

from __future__ import annotations

# per-layer KL (evaluate/lens.py): the lens costs two lm_head projections per decoder layer and
# position, so it covers positions spread evenly over the evaluation, as many as keep that work
# within LENS_WORK_SHARE of a plain eval's matmul work (evaluate/lens.py lens_positions), at least
# LENS_MIN_POSITIONS (every position of an evaluation that has no more) and at most
# LENS_MAX_POSITIONS; the eval's JSON gives the count (`layer_kl_positions`) and the page says it.
# On SmolLM2 (its lm_head 49,152 x 576, ~7x a decoder layer's Linears) that is 201 positions of
# 4,096, and all per-layer figures cost 1.30x a plain eval (issue 31's target: 1.5x;
# docs/performance.md "Eval: per-layer figures vs a plain eval (smollm2)")
LENS_MAX_POSITIONS = 512
LENS_MIN_POSITIONS = 128
LENS_WORK_SHARE = 0.3
# the isolated per-Linear SQNR (evaluate/metrics.py) feeds each quantized Linear the reference's input
# once more: one extra matmul per Linear and position, on at most this many positions (the end-to-end
# SQNR, which costs nothing extra, covers every position); 1024 puts all per-layer figures at about
# 1.2x a plain eval's matmul work on the demo LM (issue 31)
SQNR_MAX_POSITIONS = 1024
KV_MODES = ("auto", "off")  # --kv-cache: auto = emulate when the artifact has a KV-cache scheme
STRATEGIES = {"tensor": "per tensor", "attn_head": "per KV head"}


def describe(entry: dict | None) -> str:
    """One line for people: what the KV cache is and whether it was emulated."""
    if not entry or entry.get("dtype") is None:
        return "not quantized"
    how = f"{entry['dtype']} {STRATEGIES.get(entry['strategy'], entry['strategy'])}"
    if entry["emulated"]:
        return f"{how}, emulated ({entry['modules']} attention modules)"
    return f"{how}, not emulated (--kv-cache {entry['mode']})"
