"""MiniMax's family rules."""

from __future__ import annotations

from tfcompile.families.family import Family

# MiniMax-M2: GQA + experts `block_sparse_moe.experts.{e}.w1/w2/w3` (w1/w3 one group), router
# `block_sparse_moe.gate` kept (vLLM minimax_m2.py `MiniMaxM2MoE`: ReplicatedLinear, quant_config=None).
MINIMAX_M2 = Family("minimax_m2", ("minimax_m2",))
