"""The reference speculative decoder's exactness property, and its figures.

Whatever the drafter proposes, speculative decoding with greedy verification must emit the
target's own greedy decoding token for token (the oracle: `greedy`, one token per forward).
"""

from __future__ import annotations

import pytest
import torch

from tfcompile.draft.spec import NGramDrafter, Stats, Target, greedy, speculative


class Fixed:
    """A drafter proposing given tokens (a test double for the accept / reject logic)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def begin(self, prompt, aux):
        pass

    def verified(self, aux):
        pass

    def propose(self, seq, k):
        return self.tokens(seq, k)


def test_ngram_proposes_what_followed_the_latest_match():
    d = NGramDrafter(min_n=1, max_n=3)
    assert d.propose([5, 6, 7, 8, 9, 5, 6, 7], 2) == [8, 9]  # suffix 5 6 7 seen at 0
    assert d.propose([1, 2, 9, 1, 2, 8, 1, 2], 3) == [8, 1, 2]  # the latest of two matches
    assert d.propose([1, 2, 3], 4) == []  # no suffix seen before
    assert d.propose([4, 4], 3) == [4]  # cut at the end of the sequence


@pytest.mark.parametrize("k", [1, 3, 6])
def test_ngram_speculative_output_is_the_targets_greedy_output(demo_target, demo_prompts, k):
    target = Target(demo_target)
    for p in demo_prompts[:3]:
        out, st = speculative(target, NGramDrafter(), p, 40, k)
        assert out == greedy(target, p, 40)
        assert st.tokens == 39 and st.forwards <= 39


def test_oracle_drafts_are_all_accepted_and_wrong_ones_none(demo_target, demo_prompts):
    """A drafter that knows the greedy continuation: every token accepted, k+1 per forward;
    one that is always wrong: one token per forward. Both still emit the greedy output."""
    target = Target(demo_target)
    p = demo_prompts[0]
    ref = greedy(target, p, 33)
    full = p + ref

    def right(seq, k):
        return full[len(seq):len(seq) + k]

    def wrong(seq, k):
        return [(t + 1) % 4096 for t in full[len(seq):len(seq) + k]]

    out, st = speculative(target, Fixed(right), p, 33, 4)
    assert out == ref
    assert st.forwards == 32 // 5 + (32 % 5 > 0) and st.per_position()[0] == 1.0
    out, st = speculative(target, Fixed(wrong), p, 33, 4)
    assert out == ref and st.forwards == 32 and st.acceptance_length == 1.0
    assert st.per_position() == [0.0] * 4


def test_eagle_speculative_output_is_the_targets_greedy_output(demo_target, demo_prompts, tiny_draft):
    from tfcompile.draft.acceptance import drafter_factory

    make, aux, _ = drafter_factory(str(tiny_draft))
    target, plain = Target(demo_target, aux), Target(demo_target)
    for k in (2, 5):
        for p in demo_prompts[:3]:
            out, st = speculative(target, make(), p, 40, k)
            assert out == greedy(plain, p, 40)
            assert st.proposed > 0


def test_stats_per_position_counts_rounds_that_drafted_that_far():
    st = Stats(3, tokens=7, forwards=3, drafted=[3, 3, 2], accepted=[2, 1, 0])
    assert st.acceptance_length == pytest.approx(7 / 3)
    assert st.per_position() == [2 / 3, 1 / 3, 0.0]
    st.add(Stats(3, tokens=1, forwards=1, drafted=[1, 0, 0], accepted=[0, 0, 0]))
    assert st.per_position() == [0.5, 1 / 3, 0.0]
    assert Stats(2).per_position() == [None, None]


class BatchVariantTarget(Target):
    """A target whose logits depend on how many positions one forward scores, as a W4A4-emulated
    model's do (ulp-level differences of the matmul shapes, moved across FP4 rounding boundaries):
    the next token is a hash of the sequence so far, except that a forward of n > 1 positions
    sees the runner-up token win at every position whose hash is odd. Its `greedy` (one position
    per forward) is well defined, and a verifier that scores all drafts in one forward reads other
    logits than greedy decoding does."""

    V = 50

    def __init__(self):
        self.seq: list[int] = []
        self.aux_layers = None

    def reset(self) -> None:
        self.seq = []

    def crop(self, n: int) -> None:  # what a batched verifier would call
        del self.seq[n:]

    def forward(self, ids):
        rows = []
        for t in ids:
            self.seq.append(t)
            h = hash(tuple(self.seq)) % 1000003
            logit = torch.zeros(self.V)
            logit[h % self.V], logit[(h // self.V) % self.V] = 1.0, 0.999
            if len(ids) > 1 and h % 2:  # the batch-shape effect
                logit[(h // self.V) % self.V] = 1.001
            rows.append(logit)
        return torch.stack(rows), None


def test_verification_is_exact_on_a_target_that_is_not_batch_invariant():
    """Drafts from the target's own greedy continuation must all be accepted and the output must
    be the greedy one, even when one forward over several positions would give other argmaxes."""
    target = BatchVariantTarget()
    p = [1, 2, 3, 4]
    ref = greedy(target, p, 30)
    full = p + ref
    out, st = speculative(target, Fixed(lambda seq, k: full[len(seq):len(seq) + k]), p, 30, 4)
    assert out == ref
    assert st.per_position()[0] == 1.0  # every oracle draft token accepted
    out, _ = speculative(target, NGramDrafter(), p, 30, 3)
    assert out == ref
