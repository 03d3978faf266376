"""Training and held-out tokens for distillation, through the calibration loaders.

`distill.data` names the text as `--calib` does (calibration/datasets.py), with
separate training and held-out parts that never share a document:

- "python-doc": the corpus' `train` split for training (the demo LM's own
  training text; the calib split is left to calibration) and its `heldout`
  split for the before/after figures, cut exactly as `tfcompile eval` cuts it
  (so the manifest's figures match `tfcompile eval OUT --max-tokens N`).
- a file, a `save_to_disk` folder or a cached data set: documents are assigned
  to held-out when sha256(document) % 100 < `heldout_percent` (stable, order
  independent), the rest train.
- "self" / "random": sequences the teacher samples itself (or random ids), the
  held-out ones with a different seed.

Training blocks: documents shuffled with the seed, tokenized with the
tokenizer's special tokens, joined with EOS and cut into blocks of `seq_len`
(calibration.corpus.iter_token_blocks); only as many as the run uses are made.
Which blocks a step uses is a pure function of (seed, step) (`step_blocks`),
so a resumed run needs no data state beyond its step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from tfcompile.calibration.corpus import iter_token_blocks, python_doc_texts
from tfcompile.calibration.datasets import calibration_tokens, load_texts
from tfcompile.errors import UserError
from tfcompile.evaluate.text import load_text, token_rows

SELF_SEED_OFFSET = 1_000_003  # held-out sequences of "self"/"random" use seed + this


@dataclass(frozen=True)
class DistillData:
    train: torch.Tensor  # int64 [n_blocks, seq_len]; a run cycles over them in seeded epochs
    heldout: list  # 1-D int64 rows of heldout_seq_len tokens (tfcompile.evaluate.text.token_rows)
    source: str  # e.g. "python-doc:train" / "python-doc:heldout"
    heldout_source: str


def load_data(data: str, tokenizer, teacher, *, blocks: int, seq_len: int, heldout_tokens: int,
              heldout_seq_len: int, heldout_percent: float, seed: int) -> DistillData:
    """`blocks` training blocks of `seq_len` tokens (fewer if the text is short) and the held-out rows."""
    vocab = int(teacher.get_output_embeddings().weight.shape[0])
    if data in ("self", "random"):
        train = calibration_tokens(data, tokenizer, samples=blocks, seq_len=seq_len, seed=seed,
                                   model=teacher, vocab=vocab)
        rows = max(1, -(-heldout_tokens // heldout_seq_len)) if heldout_tokens else 0
        held = calibration_tokens(data, tokenizer, samples=rows, seq_len=heldout_seq_len,
                                  seed=seed + SELF_SEED_OFFSET, model=teacher, vocab=vocab) if rows else None
        heldout = [] if held is None else list(held.reshape(-1)[:heldout_tokens].split(heldout_seq_len))
        return DistillData(train, heldout, f"{data}(seed={seed})", f"{data}(seed={seed + SELF_SEED_OFFSET})")
    _need_tokenizer(tokenizer, data)
    train_texts, held_text, names = _texts(data, tokenizer, seed, heldout_percent)
    train = _blocks(train_texts, tokenizer, seq_len, blocks, data)
    heldout = []
    if heldout_tokens:
        heldout = token_rows(held_text, tokenizer, max_tokens=heldout_tokens, seq_len=heldout_seq_len,
                             vocab=vocab)
    return DistillData(train, heldout, names[0], names[1])


def _texts(data: str, tokenizer, seed: int, percent: float) -> tuple[list[str], str, tuple[str, str]]:
    """(shuffled training documents, held-out text, (train name, held-out name))."""
    if data == "python-doc":
        texts = python_doc_texts("train")
        order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
        return [texts[i] for i in order], load_text(None).text, ("python-doc:train", "python-doc:heldout")
    docs = load_texts(data, tokenizer, seed)  # shuffled with the seed
    held = [d for d in docs if _bucket(d) < percent]
    train = [d for d in docs if _bucket(d) >= percent]
    if not held or not train:
        raise UserError(f"distill data {data}: {len(docs)} documents give {len(train)} for training and "
                        f"{len(held)} held out ({percent}% by hash)",
                        hint="give more documents (one per line in a .txt), or change "
                             "--set distill.heldout_percent=P")
    return train, "\n\n".join(held), (f"{data}:train", f"{data}:heldout({percent}%)")


def _bucket(doc: str) -> float:
    return int(hashlib.sha256(doc.encode("utf-8")).hexdigest()[:8], 16) % 100


def _blocks(texts: list[str], tokenizer, seq_len: int, blocks: int, data: str) -> torch.Tensor:
    got = list(iter_token_blocks(tokenizer, texts, seq_len, blocks))
    if not got:
        raise UserError(f"distill data {data}: the training text gives no block of {seq_len} tokens",
                        hint="give more text, or lower --set distill.seq_len=N")
    return torch.tensor(got, dtype=torch.int64)


def _need_tokenizer(tokenizer, data: str) -> None:
    if tokenizer is None:
        raise UserError(f"distill data {data}: the checkpoint has no tokenizer files",
                        hint="add the tokenizer to the checkpoint, or use --set distill.data=self")


class BlockOrder:
    """Which training blocks each micro-batch uses: a pure function of (seed, step, micro).

    Sample i = (step * accum + micro) * batch + b walks a seeded permutation of
    the blocks, a new one each epoch (epoch = i // n_blocks)."""

    def __init__(self, n_blocks: int, batch: int, accum: int, seed: int):
        self.n, self.batch, self.accum, self.seed = n_blocks, batch, accum, seed
        self._perms: dict[int, torch.Tensor] = {}  # epoch -> permutation (the last few)

    def blocks(self, step: int, micro: int) -> torch.Tensor:
        """Block indices, int64 [batch]."""
        first = (step * self.accum + micro) * self.batch
        out = []
        for i in range(first, first + self.batch):
            epoch, pos = divmod(i, self.n)
            out.append(int(self._perm(epoch)[pos]))
        return torch.tensor(out, dtype=torch.int64)

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            gen = torch.Generator().manual_seed(self.seed * 1_000_033 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=gen)
        return self._perms[epoch]
