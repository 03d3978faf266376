"""`torchrun --nproc-per-node 2 -m tfcompile draft` (tfcompile/draft/ranks.py) writes the bytes of
one process run with `--batch-parts 2` (model.safetensors and tfcompile/draft.json), on the demo LM:
the self-generated chunks (two: 64 + 8 rows, one per rank, each written to the resume folder by
the rank that decoded it) and the target cache (ten chunks of 8 rows, round robin) are computed
by one rank each and broadcast, each step's 4 sequences are trained as two parts of 2, one per
rank, their gradients summed over the ranks and halved (exact for two). One process runs on one
thread, as each torchrun rank does. A --batch that does not split over the ranks is refused with a
hint before any work; a rank killed mid-training fails the run (nothing at OUT) and the same
command resumes from the checkpoint to the same bytes (CI's slow job: two launches, 27 s here
unloaded, 63 s under load; the identity test takes 16 s, the refusal 6 s).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from dist_util import leftovers, run, torchrun, tree

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
SMALL = ["--steps", "4", "--batch", "4", "--seq-len", "32", "--text-blocks", "8", "--self-blocks", "72",
         "--self-prompt", "8", "--checkpoint-every", "2", "--draft-vocab", "512", "-q"]


def _one_process(out: Path, *args: str) -> None:
    """`tfcompile draft` in this process on one torch thread (a torchrun rank's count)."""
    from tfcompile.cli.main import main
    from tfcompile.dist.devices import one_torch_thread

    with open("/dev/null", "w") as f, contextlib.redirect_stdout(f), one_torch_thread():
        assert main(["draft", str(DEMO), "-o", str(out), *SMALL, *args]) == 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one")
    _one_process(out / "draft", "--batch-parts", "2", "--resume-dir", str(out / "resume"))
    return out


def test_two_ranks_write_the_one_process_draft(reference, tmp_path):
    cmd = torchrun(2, "-m", "tfcompile", "draft", str(DEMO), "-o", str(tmp_path / "draft"), *SMALL,
                   "--resume-dir", str(tmp_path / "resume"), "--json")
    res = run(cmd)
    assert res.returncode == 0, res.stderr[-4000:]
    a, b = tree(reference / "draft"), tree(tmp_path / "draft")
    assert sorted(a) == sorted(b) == ["config.json", "model.safetensors", "tfcompile/draft.json"]
    assert [f for f in a if a[f] != b[f]] == [], "files differ from the one-process draft"
    rec = json.loads(a["tfcompile/draft.json"])
    assert rec["config"]["batch_parts"] == 2 and "processes" not in rec["training"]
    assert rec["data"]["self_sequences"] == 72
    doc = json.loads(res.stdout)  # rank 0's --json alone
    assert doc["ok"] and doc["timings"]["processes"] == 2 and doc["timings"]["threads"] == 1
    # each self-generated chunk in the resume folder, written by the rank that decoded it: one process's
    chunks = sorted(p.name for p in (tmp_path / "resume").glob("selfgen-*"))
    assert chunks == ["selfgen-00000.safetensors", "selfgen-00001.safetensors"]
    for name in chunks:
        assert (tmp_path / "resume" / name).read_bytes() == (reference / "resume" / name).read_bytes(), name
    assert json.loads((tmp_path / "resume" / "run.json").read_text())["processes"] == 2


@pytest.mark.slow
def test_two_ranks_with_the_cache_on_disk_write_the_one_process_draft(reference, tmp_path):
    """--cache disk: each rank writes its chunks of the target cache to the shared resume folder and
    reads the others' after a barrier (tfcompile/draft/cache.py): the same bytes again."""
    res = run(torchrun(2, "-m", "tfcompile", "draft", str(DEMO), "-o", str(tmp_path / "draft"), *SMALL,
                       "--resume-dir", str(tmp_path / "resume"), "--cache", "disk"))
    assert res.returncode == 0, res.stderr[-4000:]
    a, b = tree(reference / "draft"), tree(tmp_path / "draft")
    assert [f for f in a if a[f] != b.get(f)] == [], "files differ from the one-process draft"
    assert len(list((tmp_path / "resume").glob("tcache-*.safetensors"))) == 10  # 80 sequences, chunks of 8


def test_a_batch_that_does_not_split_is_refused_before_any_work(tmp_path):
    out, resume = tmp_path / "bad", tmp_path / "bad-resume"
    res = run(torchrun(2, "-m", "tfcompile", "draft", str(DEMO), "-o", str(out), *SMALL[:-1], "--batch", "3",
                       "--resume-dir", str(resume)))  # rank 0 not quiet: no training progress either
    assert res.returncode == 1, res.stderr[-4000:]
    assert "--batch 3 does not split over the 2 processes" in res.stderr and "hint: make --batch a multiple of 2" \
        in res.stderr, res.stderr[-4000:]
    assert "distill draft" not in res.stderr  # no training step ran
    assert leftovers(tmp_path, "bad") == [] and not resume.exists()


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_the_rerun_resumes(reference, tmp_path):
    out, resume = tmp_path / "out", tmp_path / "resume"
    cmd = torchrun(2, "-m", "tfcompile", "draft", str(DEMO), "-o", str(out), *SMALL, "--resume-dir", str(resume))
    res = run(cmd, env={"TFCOMPILE_FAULT": "1:draft-step-3:kill"})  # after step 3: the checkpoint of step 2 kept
    assert res.returncode == 1, res.stderr[-3000:]
    assert leftovers(tmp_path, "out") == []
    assert "rank 0 of 2 stopped in pass 'draft': rank 1 (in pass 'draft') stopped responding" in res.stderr, \
        res.stderr[-3000:]
    res = run(cmd + ["--json"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["timings"]["resumed_at"] == 2
    assert tree(out) == tree(reference / "draft")
