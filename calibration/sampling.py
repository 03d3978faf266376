"""Calibration tokens sampled from the model itself (`--calib self`), at a bounded cost.

Sampling `samples` sequences of `seq_len` tokens one token at a time costs seq_len sequential
decode steps of `samples` tokens each: small, latency-bound forwards (16 x 128 tokens on
SmolLM2-135M: 9 s against 2 s for the calibration forward itself, 1,100 s on a loaded 2-core
machine; on a 70B model hours). Instead we sample many short sequences in parallel and pack
them, like documents, into the [samples, seq_len] block:

- each sequence starts at BOS and has at most SEQ_TOKENS tokens (BOS included);
- ceil(samples * seq_len / SEQ_TOKENS) sequences are sampled, BATCH at a time, each batch by
  one `generate` call with the KV cache (temperature 1, top-k 50, no EOS before the end);
- their tokens are concatenated and cut into `samples` rows of `seq_len`.

Sequential decode steps: SEQ_TOKENS - 1 per batch, ceil(sequences / BATCH) batches (64 x 512
tokens: 4 batches of 31 steps of 256 tokens), so the cost follows the token count, as the
calibration forward's does, instead of the sequence length. Seeded: the same seed gives the
same tokens; the caller's RNG state is left as it was.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SEQ_TOKENS = 32  # tokens per sampled sequence, BOS included
BATCH = 256  # sequences per generate() call
TOP_K = 50


def sample_from_model(model: Any, tokenizer: Any, *, samples: int, seq_len: int, seed: int,
                      progress: Any = None) -> torch.Tensor:
    """int64 [samples, seq_len]: short model-sampled sequences from BOS, packed (module doc).
    `progress` (a pipeline reporter) advances once per decode step of every batch."""
    start = tokenizer.bos_token_id if tokenizer is not None and tokenizer.bos_token_id is not None else 0
    length = min(seq_len, SEQ_TOKENS)
    count = math.ceil(samples * seq_len / length)
    extra = {}
    if progress is not None and length > 1:
        progress.task(f"sample {count} x {length} calibration tokens from the model",
                      math.ceil(count / BATCH) * (length - 1))
        extra["stopping_criteria"] = _progress_criteria(progress)
    from transformers.utils import logging as hf_logging  # lazy: transformers; only when a model samples

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # generation-config notices are not ours to print
    try:
        with torch.random.fork_rng(), torch.inference_mode():  # seeded; the caller's RNG untouched
            torch.manual_seed(seed)
            rows = [_generate(model, min(BATCH, count - i), length, int(start), extra)
                    for i in range(0, count, BATCH)]
    finally:
        hf_logging.set_verbosity(verbosity)
    flat = torch.cat(rows).reshape(-1)
    return flat[: samples * seq_len].reshape(samples, seq_len).to(torch.int64)


def _progress_criteria(progress: Any) -> Any:
    """A `generate` stopping criterion that never stops: it advances `progress` once per step."""
    from transformers import StoppingCriteria, StoppingCriteriaList  # lazy: transformers; with progress only

    class _Progress(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            progress.advance(1)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    return StoppingCriteriaList([_Progress()])


def _generate(model: Any, batch: int, length: int, start: int, extra: dict) -> torch.Tensor:
    """[batch, length] token ids: BOS then length - 1 sampled tokens."""
    prompt = torch.full((batch, 1), start, dtype=torch.int64)
    if length == 1:
        return prompt
    out = model.generate(prompt, do_sample=True, top_k=TOP_K, temperature=1.0, max_new_tokens=length - 1,
                         min_new_tokens=length - 1, pad_token_id=start, attention_mask=torch.ones_like(prompt),
                         **extra)
    return out[:, :length]
