"""The KV-cache emulation's names and its one line for people, and the lens's position limit,
without torch.

kvcache.py (the emulation itself, torch) re-exports these; the CLI's `--kv-cache` choice and the
report page read them from here, so neither imports torch to build its help or its page.
"""

from __future__ import annotations

# per-layer KL (evaluate/lens.py) covers at most this many positions: the lens costs two lm_head
# projections per decoder layer and position, and 512 keeps all per-layer figures within 1.5x of a
# plain eval's matmul work on the demo LM (2048 cost 1.75x; bench/eval_layers.py, issue 31); the
# mean KL of 512 positions ranks layers as well, and the page says which positions it covers
LENS_MAX_POSITIONS = 512
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
