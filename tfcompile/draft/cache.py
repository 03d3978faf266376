"""TargetCache: the frozen target's outputs for every training sequence, computed once.

The target is frozen, so a training step needs only the draft: per sequence the cache keeps
the fused hidden states `fused` [T, 3H] (the draft's input) and the target's final, normed hidden
state `last` [T, H]; a step turns the latter into log-probabilities over the draft vocabulary
with the target's own head (restricted to its rows): ~H x Vd multiply-adds per token instead of a
whole target forward.

Size: 4 H values per token. SmolLM2-135M (H = 576) in float32: 9.2 KB per token, 786,432 tokens
7.2 GB; `draft.cache_dtype=bfloat16` halves it (the values are rounded to bf16, as an engine
serving the target in bf16 hands its draft bf16 hidden states; recorded, it changes the bits).

Where it is kept (`draft.cache`, a runtime choice: the bits are the same either way):
- "memory": two tensors allocated once and filled in place;
- "disk": one safetensors file per chunk of CHUNK sequences in the resume folder
  (`tcache-{chunk:05d}.safetensors`, tensors `fused` and `last`, written atomically), read back
  row by row (safetensors slices, no pickle) when a step needs them: memory stays bounded by a
  step's rows, and a killed run resumes without computing the cache again (the folder's
  fingerprint pins what a chunk holds; each file is checked for shape and dtype when read).

Chunk c is computed by rank c mod N under torchrun (ranks.py); in memory it is then broadcast,
on disk every rank reads the files the others wrote after a barrier (the resume folder is shared,
as distill's checkpoints are).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save

from tfcompile.dist.world import LOCAL, World
from tfcompile.draft.ranks import broadcast_chunks, owner
from tfcompile.errors import UserError
from tfcompile.io.atomic import write_atomic
from tfcompile.io.dtypes import code_of

CHUNK = 8  # sequences per target forward, and per cache file: fixed, so the cache is a function of tokens
PLACES = ("memory", "disk")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class _Memory:
    """Both tensors [N, T, width] allocated once (concatenating chunks would hold them twice)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype):
        self.parts = {k: torch.empty(s, dtype=dtype) for k, s in shapes.items()}

    def has(self, c: int) -> bool:
        return False

    def put(self, c: int, values: dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            self.parts[k][c * CHUNK: c * CHUNK + len(v)] = v

    def share(self, chunks: int, world: World) -> None:
        for x in self.parts.values():  # dim-0 slices of contiguous tensors are contiguous
            broadcast_chunks([x[c * CHUNK:(c + 1) * CHUNK] for c in range(chunks)], world)

    def rows(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v[idx] for k, v in self.parts.items()}


class _Disk:
    """One file per chunk in `folder`: tensors fused [rows, T, 3H] and last [rows, T, H]."""

    def __init__(self, folder: Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype):
        self.folder, self.shapes, self.dtype = Path(folder), shapes, dtype

    def _file(self, c: int) -> Path:
        return self.folder / f"tcache-{c:05d}.safetensors"

    def _rows_in(self, c: int) -> int:
        return min(CHUNK, self.shapes["fused"][0] - c * CHUNK)

    def has(self, c: int) -> bool:
        f = self._file(c)
        if not f.is_file():
            return False
        try:
            with safe_open(f, framework="pt") as h:
                got = {k: (tuple(h.get_slice(k).get_shape()), h.get_slice(k).get_dtype()) for k in h.keys()}
        except Exception as e:  # noqa: BLE001 - a damaged file: name it
            raise UserError(f"--resume-dir: cannot read {f} ({type(e).__name__}: {e})",
                            hint=f"delete {f} to compute that part of the target cache again") from None
        want = {k: ((self._rows_in(c), *s[1:]), code_of(self.dtype)) for k, s in self.shapes.items()}
        if got != want:
            raise UserError(f"--resume-dir: {f} holds {got}, not this run's target cache {want}",
                            hint=f"delete {f} to compute that part of the target cache again")
        return True

    def put(self, c: int, values: dict[str, torch.Tensor]) -> None:
        write_atomic(self._file(c), save({k: v.contiguous() for k, v in values.items()}))

    def share(self, chunks: int, world: World) -> None:
        world.barrier("draft target cache")  # every rank's files are written before anyone reads

    def rows(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {k: [] for k in self.shapes}
        for i in idx.tolist():
            c, r = divmod(i, CHUNK)
            with safe_open(self._file(c), framework="pt") as h:
                for k in out:
                    out[k].append(h.get_slice(k)[r:r + 1])
        return {k: torch.cat(v) for k, v in out.items()}


class TargetCache:
    """The target's fused and final hidden states for `tokens` [N, T] (module docstring)."""

    def __init__(self, target, tokens: torch.Tensor, aux: tuple[int, ...], keep: torch.Tensor | None, *,
                 dtype: str = "float32", place: str = "memory", folder: Path | None = None,
                 world: World = LOCAL):
        if place == "disk" and folder is None:
            raise UserError("the draft's target cache on disk needs a folder to keep it in",
                            hint="pass --resume-dir DIR with --cache disk")
        dev = next(target.parameters()).device
        n, t, h = tokens.shape[0], tokens.shape[1], int(target.config.get_text_config().hidden_size)
        shapes = {"fused": (n, t, len(aux) * h), "last": (n, t, h)}
        store_dtype = DTYPES[dtype]
        self.store = _Disk(folder, shapes, store_dtype) if place == "disk" else _Memory(shapes, store_dtype)
        chunks = -(-n // CHUNK)
        with torch.no_grad():
            for c in range(chunks):
                if owner(c, world) != world.rank or self.store.has(c):  # under torchrun: rank c mod N
                    continue
                out = target.get_decoder()(input_ids=tokens[c * CHUNK:(c + 1) * CHUNK].to(dev),
                                           output_hidden_states=True)
                fused = torch.cat([out.hidden_states[j] for j in aux], -1)
                # last_hidden_state = hidden_states[-1], after the final norm
                self.store.put(c, {"fused": fused.float().to(store_dtype).cpu(),
                                   "last": out.last_hidden_state.float().to(store_dtype).cpu()})
        self.store.share(chunks, world)
        self.head, self.keep = target.get_output_embeddings(), keep
        first = next(target.parameters())  # the head runs where, and in the dtype, the target computes
        self.place, self.dtype = first.device, first.dtype

    def batch(self, idx: torch.Tensor, dev) -> tuple[torch.Tensor, torch.Tensor]:
        """(fused [B, T, 3H] float32, target log-probabilities over the draft vocabulary [B, T, Vd]) of rows idx."""
        got = self.store.rows(idx)
        h = got["last"].to(dev, torch.float32)
        with torch.no_grad():
            if type(self.head) is torch.nn.Linear and self.keep is not None:  # a plain head: its kept rows only
                w = self.head.weight[self.keep.to(self.head.weight.device)].to(dev, torch.float32)
                b = None if self.head.bias is None else self.head.bias[self.keep].to(dev, torch.float32)
                logits = F.linear(h.to(w.dtype), w, b)
            else:  # an emulated (quantized) head runs as the target runs it
                logits = self.head(h.to(self.place, self.dtype)).float().to(dev)
                logits = logits if self.keep is None else logits[..., self.keep.to(dev)]
        return got["fused"].to(dev, torch.float32), F.log_softmax(logits, -1)
