"""The reference speculative decoder: chain drafts of k tokens, greedy verification by the target.

Per round: the drafter proposes up to k tokens after the sequence; the target scores
[last token, d_1 .. d_m] with its KV cache; d_1..d_a are accepted while each equals the target's
argmax at the position before it, then the target's own next token (the "bonus") is appended,
so a round yields a + 1 tokens for one verification step, and the output is the target's greedy
decoding (tests check it token for token against `greedy`).

Verification runs the target one position at a time (`verify`), stopping at the first rejected
draft token: the same sequence of single-token forwards, on the same KV cache, that `greedy`
runs, so the accepted tokens are the target's greedy ones bit for bit. One forward over all
m + 1 positions (what an engine does) is not batch-invariant in float arithmetic: its matmul and
attention shapes differ from decoding's, and the last-ulp differences that leaves are harmless
for bf16 or weight-only targets but, under W4A4 emulation, move activations across FP4 rounding
boundaries and changed SmolLM2 nvfp4's greedy tokens (docs/accuracy.md). The figures are those
of the engine's algorithm all the same: a round counts as one target forward, timed as its
first single-token forward (a verification step costs about one decode step where decoding is
memory-bound, as on the GPUs that serve these drafts).

Figures (`Stats`): mean acceptance length = generated tokens / target forwards (prefill not
counted; 1.0 = no speedup), acceptance per draft position j = rounds whose draft token j was
accepted / rounds that drafted at least j tokens' worth (k_eff >= j), and the time spent in
the target and the drafter (for the modelled speedup, acceptance.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from tfcompile.draft.eagle3 import DraftState


class Drafter(Protocol):
    def begin(self, prompt: list[int], aux: torch.Tensor | None) -> None: ...
    def propose(self, seq: list[int], k: int) -> list[int]: ...
    def verified(self, aux: torch.Tensor | None) -> None: ...


class Target:
    """A causal LM (transformers module) run with a KV cache; optionally returns the fused hidden
    states an EAGLE-3 draft reads (HF hidden_states indices `aux_layers`, concatenated: [n, 3H])."""

    def __init__(self, model, aux_layers: tuple[int, ...] | None = None):
        self.model, self.aux_layers = model, aux_layers
        self.cache = None
        self.device = next(model.parameters()).device

    def reset(self) -> None:
        from transformers import DynamicCache  # lazy: transformers (~2 s to import)

        self.cache = DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, V] (float32, CPU) of the next n positions, and their fused hidden states."""
        x = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=x, cache=self.cache, use_cache=True,
                         output_hidden_states=self.aux_layers is not None)
        aux = None
        if self.aux_layers is not None:
            aux = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], -1).float().cpu()
        return out.logits[0].float().cpu(), aux


def greedy(target: Target, prompt: list[int], new_tokens: int) -> list[int]:
    """The target's own greedy decoding, one token per forward: the exactness oracle."""
    target.reset()
    logits, _ = target.forward(prompt)
    out = [int(logits[-1].argmax())]
    while len(out) < new_tokens:
        logits, _ = target.forward(out[-1:])
        out.append(int(logits[-1].argmax()))
    return out


@dataclass
class Stats:
    k: int
    tokens: int = 0  # generated (bonus included)
    forwards: int = 0  # target forwards after the prefill
    drafted: list[int] = field(default_factory=list)  # per position j: rounds with k_eff > j
    accepted: list[int] = field(default_factory=list)  # per position j: rounds accepting token j
    target_s: float = 0.0
    draft_s: float = 0.0
    proposed: int = 0  # draft tokens proposed

    def __post_init__(self):
        self.drafted = self.drafted or [0] * self.k
        self.accepted = self.accepted or [0] * self.k

    def add(self, other: "Stats") -> None:
        for f in ("tokens", "forwards", "target_s", "draft_s", "proposed"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.drafted = [a + b for a, b in zip(self.drafted, other.drafted)]
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted)]

    @property
    def acceptance_length(self) -> float:
        return self.tokens / max(1, self.forwards)

    def per_position(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted)]


def speculative(target: Target, drafter: Drafter, prompt: list[int], new_tokens: int,
                k: int) -> tuple[list[int], Stats]:
    """Decode new_tokens greedily with drafts of up to k tokens; returns (tokens, Stats)."""
    st = Stats(k)
    target.reset()
    logits, aux = target.forward(prompt)  # the prefill: not a decode cost, not timed
    drafter.begin(prompt, aux)
    out = [int(logits[-1].argmax())]
    while len(out) < new_tokens:
        seq = prompt + out
        k_eff = min(k, new_tokens - len(out) - 1)  # never draft past the end
        t1 = time.perf_counter()
        draft = drafter.propose(seq, k_eff)[:k_eff]
        st.draft_s += time.perf_counter() - t1
        a, bonus, aux, step_s = verify(target, out[-1], draft)
        st.target_s += step_s
        drafter.verified(aux)
        out += draft[:a] + [bonus]
        st.tokens += a + 1
        st.forwards += 1
        st.proposed += len(draft)
        for j in range(k_eff):
            st.drafted[j] += 1
            st.accepted[j] += int(j < a)
    return out, st


def verify(target: Target, last: int, draft: list[int]) -> tuple[int, int, torch.Tensor | None, float]:
    """Score [last, d_1 .. d_m] one position at a time until the target disagrees.

    Returns (a = accepted draft tokens, the target's bonus token after them, the fused hidden
    states of the a + 1 positions run [a + 1, 3H] or None, seconds of the first forward). The KV
    cache ends holding exactly the sequence plus the accepted tokens."""
    auxes, ids, step_s = [], [last, *draft], 0.0
    for j, tok in enumerate(ids):
        t0 = time.perf_counter()
        logits, aux = target.forward([tok])
        if j == 0:
            step_s = time.perf_counter() - t0
        if aux is not None:
            auxes.append(aux)
        pred = int(logits[-1].argmax())  # the target's token after [.., last, d_1..d_j]
        if j == len(draft) or draft[j] != pred:
            return j, pred, torch.cat(auxes) if auxes else None, step_s
    raise AssertionError("unreachable: the last position always returns")


class NGramDrafter:
    """Prompt lookup (vLLM's `ngram` method): the longest suffix n-gram (max_n down to min_n) seen
    earlier in the sequence; propose the tokens that followed its most recent earlier occurrence."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n

    def begin(self, prompt, aux) -> None:
        pass

    def verified(self, aux) -> None:
        pass

    def propose(self, seq: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            suffix = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):  # most recent earlier occurrence first
                if seq[start:start + n] == suffix:
                    return seq[start + n:start + n + k]
        return []


class EagleDrafter:
    """An EAGLE-3 draft (eagle3.Eagle3Draft) as a Drafter: it reads the target's hidden states."""

    def __init__(self, draft):
        self.draft = draft
        self.state: DraftState | None = None

    def begin(self, prompt, aux) -> None:
        self.state = DraftState(self.draft)
        self.state.extend(aux)

    def verified(self, aux) -> None:
        self.state.extend(aux)

    def propose(self, seq: list[int], k: int) -> list[int]:
        return self.state.propose(seq, k)
