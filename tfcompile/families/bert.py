"""BERT encoders' family rules (MiniLM)."""

from __future__ import annotations

from tfcompile.families.family import Family

# Every encoder-layer Linear is one vLLM builds with quant_config (bert.py: BertSelfAttention's
# QKVParallelLinear packs query/key/value, BertSelfOutput / BertOutput RowParallelLinear `dense`,
# BertIntermediate ColumnParallelLinear); the pooler is outside the layers.
BERT = Family("bert", ("bert",))
