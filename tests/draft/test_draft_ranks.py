"""tfcompile/draft/ranks.py without torchrun: how a step's batch is cut into parts and spread over
ranks, and the refusals (with hints) of a --batch or --batch-parts that does not split. The
2-process runs themselves are tests/dist/test_draft.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"


def test_parts_default_to_the_world_size_and_cover_the_batch():
    from tfcompile.dist.world import World
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.ranks import my_parts, part_rows, resolve_parts

    one = resolve_parts(DraftConfig(batch=4), World())
    assert one.batch_parts == 1 and "batch_parts" not in one.record()  # one process: the record as before
    idx = torch.arange(10, 18)
    for size in (2, 4):
        cfgs = [resolve_parts(DraftConfig(batch=8, batch_parts=4), World(r, size)) for r in range(size)]
        rows = [part_rows(idx, p, c) for r, c in enumerate(cfgs) for p in my_parts(c, World(r, size))]
        assert torch.equal(torch.cat(rows), idx)  # every sequence once, in order, in 4 parts of 2
        assert cfgs[0].record()["batch_parts"] == 4
    assert resolve_parts(DraftConfig(batch=6), World(1, 2)).batch_parts == 2


@pytest.mark.parametrize("batch, parts, size, message", [
    (3, 0, 2, "--batch 3 does not split over the 2 processes"),
    (4, 3, 1, "--batch 4 does not split over --batch-parts 3"),
    (6, 3, 2, "--batch-parts 3 is not a multiple of the 2 processes"),
])
def test_a_batch_that_does_not_split_is_refused_with_a_hint(batch, parts, size, message):
    from tfcompile.dist.world import World
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.ranks import resolve_parts
    from tfcompile.errors import UserError

    with pytest.raises(UserError) as e:
        resolve_parts(DraftConfig(batch=batch, batch_parts=parts), World(0, size))
    assert message in e.value.message and e.value.hint


def test_the_cli_refuses_before_any_work(tmp_path, run_cli):
    res = run_cli("draft", DEMO, "-o", tmp_path / "x", "--batch", "4", "--batch-parts", "3",
                  "--resume-dir", tmp_path / "r")
    assert res.code == 1 and "--batch-parts 3" in res.err and "hint:" in res.err
    assert not (tmp_path / "x").exists() and not (tmp_path / "r").exists()
