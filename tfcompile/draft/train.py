"""Training an EAGLE-3 draft by distillation from the target as it is served.

The target (a transformers module: the bf16 checkpoint, or a tfcompile artifact through
`tfcompile eval`'s emulation: dequantized weights, activations fake-quantized, KV cache
emulated) runs in eval mode without gradients, once per training sequence (cache.py's TargetCache), and
gives the draft its inputs (hidden_states at `aux_layers`, [B, T, 3H]) and its targets (the
next-token distribution at every position, restricted to the draft vocabulary). The draft's loss is
sum_j ttt_decay^j KL(target || draft) over the chain steps j of Eagle3Draft.ttt (step j row i
against the target's distribution at position i+1+j), averaged over the rows that exist.

Data: `text_blocks` sequences of training text (distill's loaders: python-doc's train split,
never its held-out split) and `self_blocks` sequences the target continues itself greedily
from `self_prompt` tokens of further text blocks (EAGLE-3 trains on the target's own
outputs). Which sequences a step uses is distill's BlockOrder (a pure function of seed and
step), the loop is distill's (optimizer, schedule, clipping, checkpoints, Ctrl-C), so a
resumed run ends bit-identical to an uninterrupted one on the same machine and thread count. The
self-generated sequences are kept in the resume folder chunk by chunk as they are decoded
(SelfGenerated): generation is most of a large run's data time (SmolLM2, 3,840 sequences: over an
hour on 2 cores), and a run killed in it resumes at the first missing chunk.

Under torchrun (ranks.py) the generation chunks and the cache's chunks are computed round robin
and broadcast, and each step's batch is trained in `batch_parts` parts spread over the ranks.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load, save

from tfcompile.dist.failure import inject_fault
from tfcompile.dist.world import LOCAL, World
from tfcompile.distill.data import BlockOrder, load_data
from tfcompile.distill.ddp import agree_stop
from tfcompile.distill.train import Loop, Segment, deterministic
from tfcompile.draft.cache import TargetCache
from tfcompile.draft.config import DraftConfig
from tfcompile.draft.eagle3 import Eagle3Draft
from tfcompile.draft.ranks import average_grads, broadcast_chunks, mean_parts, my_parts, owner, part_rows
from tfcompile.errors import UserError
from tfcompile.io.atomic import write_atomic


GEN_BATCH = 64  # rows greedy_continue decodes together: also one chunk of a resume folder


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, total: int, batch: int | None = None, saved=None,
                    world: World = LOCAL) -> torch.Tensor:
    """int64 [N, total]: each prompt row [N, P] continued by the model's greedy decoding.

    batch: rows decoded together. Wider batches amortize per-op overhead: SmolLM2-135M, 64 prompts of
    32 tokens continued by 16, one thread, load 10 (2026-12-05, /tmp script, medians of 3): 19.1 s at
    batch 64 against 24.9 s at 16, the same tokens.
    saved: a SelfGenerated store (a resume folder): chunks it holds are read back, each new chunk is
    written as soon as it is decoded, so a killed run loses at most one chunk of generation.
    world: under torchrun chunk c is decoded (or read back, or saved) by rank c mod N alone and
    broadcast from it (ranks.py): every rank returns the same tokens, one process's."""
    chunks = list(prompts.split(batch or GEN_BATCH))
    out = [torch.empty(len(rows), total, dtype=torch.int64) for rows in chunks]  # others' chunks: received
    for c, rows in enumerate(chunks):
        if owner(c, world) != world.rank:
            continue
        done = None if saved is None else saved.load(c, rows, total)
        if done is not None:
            out[c] = done
            continue
        out[c] = _decode(model, rows, total)
        if saved is not None:
            saved.save(c, out[c])
    broadcast_chunks(out, world)
    return torch.cat(out)


def _decode(model, rows: torch.Tensor, total: int) -> torch.Tensor:
    """One chunk's greedy continuation: int64 [rows, total] on the CPU, from prompts [rows, P]."""
    from transformers import DynamicCache  # lazy: transformers (~2 s to import)

    ids = rows.to(next(model.parameters()).device)
    cache = DynamicCache(config=model.config)
    nxt = ids
    while ids.shape[1] < total:
        # logits_to_keep=1: the head runs on the last position only (the prompt's prefill
        # would otherwise compute P x V logits per row and keep one)
        logits = model(input_ids=nxt, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids.cpu()


class SelfGenerated:
    """The target's own continuations kept in a resume folder (`selfgen-{chunk:05d}.safetensors`,
    tensor `ids` int64 [rows, total]; written to a temporary name, fsynced, renamed; read by
    safetensors, no pickle). The folder's fingerprint (config, target, torch, threads) already
    pins what a chunk holds; each chunk is checked again against its prompts when it is read."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _file(self, c: int) -> Path:
        return self.path / f"selfgen-{c:05d}.safetensors"

    def load(self, c: int, prompts: torch.Tensor, total: int) -> torch.Tensor | None:
        f = self._file(c)
        if not f.is_file():
            return None
        try:
            ids = load(f.read_bytes())["ids"]
        except Exception as e:  # noqa: BLE001 - a damaged file: name it
            raise UserError(f"--resume-dir: cannot read {f} ({type(e).__name__}: {e})",
                            hint=f"delete {f} to generate its sequences again") from None
        p = prompts.shape[1]
        if ids.dtype != torch.int64 or tuple(ids.shape) != (len(prompts), total) or not torch.equal(ids[:, :p], prompts):
            raise UserError(f"--resume-dir: {f} does not continue this run's prompts (shape {tuple(ids.shape)})",
                            hint=f"delete {f} to generate its sequences again")
        return ids

    def save(self, c: int, ids: torch.Tensor) -> None:
        write_atomic(self._file(c), save({"ids": ids.contiguous()}))


def training_tokens(cfg: DraftConfig, tokenizer, target, resume=None, world: World = LOCAL) -> tuple[torch.Tensor, dict]:
    """int64 [text_blocks + self_blocks, seq_len] and the data record. resume: the run's ResumeDir,
    where the self-generated sequences are kept as they are decoded (by the rank that decodes them).
    Every rank loads the same text (a pure function of data, seed and tokenizer)."""
    blocks = cfg.text_blocks + cfg.self_blocks
    data = load_data(cfg.data, tokenizer, target, blocks=blocks, seq_len=cfg.seq_len, heldout_tokens=0,
                     heldout_seq_len=cfg.seq_len, heldout_percent=10.0, seed=cfg.seed)
    text = data.train[: cfg.text_blocks]
    prompts = data.train[cfg.text_blocks:blocks, : cfg.self_prompt]
    parts = [text]
    if len(prompts):
        saved = None if resume is None else SelfGenerated(resume.path)
        parts.append(greedy_continue(target, prompts, cfg.seq_len, saved=saved, world=world))
    tokens = torch.cat(parts)
    return tokens, {"source": data.source, "text_sequences": len(text), "self_sequences": len(prompts),
                    "seq_len": cfg.seq_len, "tokens": int(tokens.numel())}


def draft_vocab(tokens: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent ids of `tokens` (ties: lower id first), ascending: int64 [size]."""
    counts = torch.bincount(tokens.reshape(-1), minlength=vocab).to(torch.float64)
    counts -= torch.arange(vocab, dtype=torch.float64) / (2 * vocab)  # ties broken by id, exactly
    return torch.sort(torch.topk(counts, size).indices).values


def ttt_loss(draft: Eagle3Draft, ids: torch.Tensor, fused: torch.Tensor, logp: torch.Tensor,
             steps: int, decay: float) -> tuple[torch.Tensor, dict]:
    """The training loss and, per chain step, its KL and argmax agreement with the target."""
    T = ids.shape[1]
    total, parts = 0.0, {}
    for j, lg in enumerate(draft.ttt(ids, fused, steps)):
        rows = T - 1 - j  # step j row i predicts position i+1+j's next token: i <= T-2-j
        q = F.log_softmax(lg[:, :rows], -1)
        p = logp[:, 1 + j: 1 + j + rows]
        kl = (p.exp() * (p - q)).sum(-1).mean()
        total = total + decay ** j * kl
        parts[f"kl_{j}"] = float(kl.detach())
        parts[f"acc_{j}"] = float((q.argmax(-1) == p.argmax(-1)).float().mean())
    parts["loss"] = float(total.detach())
    return total, parts


def train_draft(draft: Eagle3Draft, target, tokens: torch.Tensor, cfg: DraftConfig, *, keep,
                resume, metrics_path, reporter, world: World = LOCAL) -> dict:
    """Train `draft` in place; returns {steps, tokens, resumed_at, final: last step's loss parts}.
    Under torchrun (ranks.py) each rank computes its parts of every step's batch, the gradients are
    averaged over the ranks, only rank 0 writes checkpoints and metrics, and a signal seen by any
    rank stops every rank at the same step boundary."""
    dev = next(draft.parameters()).device
    order = BlockOrder(len(tokens), cfg.batch, 1, cfg.seed)
    keep = None if keep is None else keep.to(dev)
    cache = TargetCache(target, tokens, draft.s.aux_layers, keep, dtype=cfg.cache_dtype, place=cfg.cache,
                        folder=None if resume is None else resume.path, world=world)
    params = draft.trainable()
    mine = my_parts(cfg, world)

    def step_fn(local: int) -> dict:
        idx = order.blocks(local, 0)  # [batch], the step's sequences
        sums: dict[str, float] = {}
        for part in mine:  # one forward and backward per part: the gradients accumulate
            rows = part_rows(idx, part, cfg)  # [batch / P]
            fused, logp = cache.batch(rows, dev)
            loss, parts = ttt_loss(draft, tokens[rows].to(dev), fused, logp, cfg.ttt_steps, cfg.ttt_decay)
            loss.backward()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
        average_grads(params, cfg, world)
        return mean_parts(sums, cfg, world)

    loop = Loop(cfg, resume=resume, metrics_path=metrics_path if world.is_root else None, reporter=reporter,
                total_steps=cfg.steps, tokens_per_step=cfg.batch * cfg.seq_len)
    if world.distributed:
        loop.saves = world.is_root  # every rank reads the checkpoint, rank 0 writes it
        loop.agree = functools.partial(agree_stop, world=world)
        # TFCOMPILE_FAULT=RANK:draft-step-K:raise|kill fails that rank after step K (tests)
        loop.after_step = lambda step: inject_fault(world, f"draft-step-{step}")
    loop.adopt(params)
    with deterministic():
        loop.run(Segment("draft", params, 0, cfg.steps, step_fn))
    return {"steps": cfg.steps, "tokens_seen": cfg.steps * cfg.batch * cfg.seq_len,
            "resumed_at": loop.resumed_at, "final": {k: _sig(v) for k, v in loop.last.items()}}


def _sig(v):
    return float(f"{v:.6g}") if isinstance(v, float) else v
