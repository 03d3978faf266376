"""A checkpoint whose quantized tensors read as the bf16 tensors they encode.

`DequantizedSource` wraps the memory-mapped `Checkpoint` of a published
quantized checkpoint and presents it as the bf16 model it was made from: the
same tensor names and shapes a bf16 checkpoint of that model has, dtype BF16,
each decoded from its quantized tensors when `get` asks for it (nothing is
decoded up front, nothing is kept: memory follows the tensor in hand, as for a
bf16 source). Tensors a format adds beside the weights (scales) are hidden.
Every pass reads it as it reads any checkpoint; `files` stays the real shards,
so the manifest hashes what is on disk, and `source_format` says what it was.

Decoding is the formats reference (tfcompile.kernels.formats), computed in fp32
and rounded once to bf16, which is what each format's own reference does
(DeepSeek's `weight_dequant`, transformers' GPT-OSS MXFP4 conversion,
compressed-tensors' decompressors): tests/families/test_sources.py checks the
artifact made from the published checkpoint is byte-identical to the one made
from the bf16 model those tools decode it to.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.safetensors_header import TensorInfo


class DequantizedSource(Checkpoint):
    """`inner` with the tensors of `decoders` (name -> (shape, fn() -> bf16 tensor)) in place of
    the quantized ones, and the names in `hidden` left out."""

    def __init__(self, inner: Checkpoint, decoders: dict[str, tuple[tuple[int, ...], str, Callable]],
                 hidden: set[str], source_format: dict):
        infos = {n: inner.info(n) for n in inner.names() if n not in hidden and n not in decoders}
        for name, (shape, anchor, _) in decoders.items():
            file = inner.info(anchor).file  # the shard that holds its data
            infos[name] = TensorInfo(name, "BF16", tuple(shape), file, (0, 2 * math.prod(shape)))
        super().__init__(inner.path, inner.config, infos, list(inner.files))
        self.inner = inner
        self._decoders = {n: fn for n, (_, _, fn) in decoders.items()}
        self.source_format = source_format  # the manifest's source.format

    def get(self, name: str) -> torch.Tensor:
        fn = self._decoders.get(name)
        if fn is None:
            self.info(name)  # a hidden or unknown name: the checkpoint's error, with close matches
            return self.inner.get(name)
        return fn()

    def hand_off(self) -> Callable[[], None]:
        return self.inner.hand_off()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"DequantizedSource({self.source_format['format']}, {self.inner!r})"
