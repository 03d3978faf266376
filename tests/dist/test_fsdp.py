"""`torchrun --nproc-per-node 2 -m tfcompile distill --sharding fsdp` (FSDP2: the student's
parameters, gradients and optimizer state sharded per decoder layer) writes the one-process
artifact byte for byte, on the demo LM and a tiny Qwen3 MoE (experts left in bf16: distill does
not train fused experts); a rank killed mid-training fails the run (exit 1, the rank named,
nothing at OUT), and rerunning the command resumes from the checkpoint the run left (whole
tensors gathered from the shards) to the same artifact.

The recipe exercises what could break the identity: nvfp4a16 (each fusion group's NVFP4 global
scale, computed from weights FSDP2 all-gathers), the trained unquantized tensors (parametrized
norms and embeddings, sharded too; the root unit's after the held-out forwards), gradient
clipping that is active (grad_clip 0.05, the norm is ~0.6: the clipping factor must have the
same bits as one process's), and the online teacher sharded too. Whole micro-batches
per rank (grad-accum 2): the gradient average over 2 ranks, (a + b) / 2, is exact.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from dist_util import leftovers, run, run_matrix, torchrun, tree

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
DISTILL = ["--format", "nvfp4a16", "--steps", "2", "--batch", "2", "--grad-accum", "2", "--data", "random",
           "--set", "distill.seq_len=32", "--set", "distill.heldout_tokens=64", "--set", "distill.checkpoint_every=1",
           "--set", "distill.train_unquantized=true", "--set", "distill.grad_clip=0.05"]
# no held-out figures on the MoE: transformers' MoE forward on the CPU does not give the same bits
# on 1 and 2 threads (one process vs a torchrun rank), so its held-out KL differs in the 6th digit
# under DDP as under FSDP2, while the trained weights are identical (checked by hand)
MOE = [a if a != "distill.heldout_tokens=64" else "distill.heldout_tokens=0" for a in DISTILL] + ["--ignore", "*experts*"]


@pytest.fixture(scope="module")
def models(model_factory, tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    moe = model_factory.make_tiny_qwen3_moe(tmp_path_factory.mktemp("fsdp") / "moe", experts=4)
    return {"demo": (DEMO, DISTILL), "moe": (moe, MOE)}


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> Path:
    """The one-process artifacts (the CLI in this process)."""
    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("one")
    for name, (src, args) in models.items():
        with open("/dev/null", "w") as f, contextlib.redirect_stdout(f):
            assert main(["distill", str(src), "-o", str(out / name), "-q", *args]) == 0, name
    return out


def _same(one: Path, many: Path) -> None:
    a, b = tree(one), tree(many)
    assert sorted(a) == sorted(b)
    assert not [f for f in a if a[f] != b[f]], f"{many.name}: files differ from the one-process artifact"


def test_fsdp_writes_the_one_process_artifact(models, reference, tmp_path):
    jobs = [(["distill", src, "-o", tmp_path / name, "-q", *args, "--sharding", "fsdp", "--json"],
             tmp_path / f"{name}.json") for name, (src, args) in models.items()]
    res = run_matrix(2, jobs, tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    for name in models:
        stats = json.loads((tmp_path / f"{name}.json").read_text())["passes"]["distill"]
        assert stats["sharding"] == "fsdp"  # not a silent DDP run
        _same(reference / name, tmp_path / name)
    manifest = json.loads((reference / "demo" / "tfcompile" / "manifest.json").read_text())
    assert manifest["distill"]["final_loss"]["grad_norm"] > 0.05  # the clipping was active


def test_killed_rank_fails_the_run_and_the_rerun_resumes(reference, tmp_path):
    out, resume = tmp_path / "out", tmp_path / "resume"
    cmd = torchrun(2, "-m", "tfcompile", "distill", str(DEMO), "-o", str(out), "-q", *DISTILL,
                   "--sharding", "fsdp", "--resume-dir", str(resume))
    res = run(cmd, env={"TFCOMPILE_FAULT": "1:distill-step-2:kill"})  # after step 2, before its checkpoint
    assert res.returncode == 1, res.stderr[-3000:]
    assert leftovers(tmp_path, "out") == []
    assert "error: rank 0 of 2 stopped in pass 'distill': rank 1 (in pass 'distill') stopped responding" \
        in res.stderr, res.stderr[-3000:]
    res = run(cmd + ["--json"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["passes"]["distill"]["resumed_at"] == 1  # the last checkpoint: step 1 of 2
    _same(reference / "demo", out)
