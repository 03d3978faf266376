"""torchrun --nproc-per-node 2 and 3 write the artifact one process writes, byte for byte.

Three recipes (nvfp4a16 RTN with the modelopt view too, nvfp4 with calibrated activation and
FP8 KV-cache scales, nvfp4a16 GPTQ: each layer solved in the layer loop by the ranks owning its
Hessians and shared before the next, calibrate.propagate) on three models (the demo LM, a tiny
Qwen3 MoE, a tiny Qwen3.5 with its MTP layer, which calibration runs after the loop), and nvfp4a16 GPTQ without propagation (solved in pack), nvfp4 with propagation (RTN
in the layer loop, inputs quantized on the rerun) and AWQ on the demo LM, each against its
one-process artifact. Calibration
uses 5 sequences in batches of 1, so 2 and 3 ranks both get uneven shares (a rank sits out
the last round). Small shards (pack.max_shard_mb) make every rank write some files; the
default single shard makes rank 0 write all and receive the other ranks' GPTQ solves.
`tfcompile eval` of one artifact gives the one-process figures to the last bit (the KL per layer
too: its first 2048 positions end inside batch 10, rank 1's of 3); `tfcompile
distill` on 2 processes (DDP, whole micro-batches per rank) writes the one-process artifact
too: averaging two gradients, (a + b) / 2, is exact and equals a/2 + b/2 (not so for 3).
All runs of a world size share one torchrun launch (tests/dist/run_matrix.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_util import run_matrix, tree

ROOT = Path(__file__).resolve().parents[2]
CALIB = ["--calib", "random", "--calib-samples", "5", "--calib-seq-len", "32", "--set", "calibrate.batch=1"]
RECIPES = {
    "rtn": ["--format", "nvfp4a16", "--set", "pack.max_shard_mb=0.5", "--export", "modelopt"],
    "calibrated": ["--format", "nvfp4", "--kv-cache", "fp8", *CALIB],
    "gptq": ["--format", "nvfp4a16", "--algorithm", "gptq", *CALIB, "--set", "pack.max_shard_mb=1",
             "--set", "quantize.gptq_expert_batch=2",  # the MoE's 4 experts: 2 solve batches, 2 owners
             "--set", "calibrate.propagate=true"],
}
AWQ = ["--format", "nvfp4a16", "--algorithm", "awq", *CALIB]
# learned rounding: every rank tunes each block on the same steps, the batch's holder hands out its
# gradient (passes/quantize/signround.py Batches); 40 steps so that blocks keep tuned codes, not RTN's
SIGNROUND = ["--format", "nvfp4a16", "--algorithm", "signround", *CALIB, "--set", "quantize.signround_iters=40"]  # whole-model loop; statistics on their owners
DISTILL = ["--format", "nvfp4a16", "--steps", "2", "--batch", "2", "--grad-accum", "2", "--data", "random",
           "--set", "distill.seq_len=32", "--set", "distill.heldout_tokens=0"]


@pytest.fixture(scope="module")
def models(model_factory, random_mtp, tmp_path_factory) -> dict[str, Path]:
    moe = model_factory.make_tiny_qwen3_moe(tmp_path_factory.mktemp("dist") / "moe", experts=4)
    # a Qwen3.5 with its MTP layer: calibration runs the MTP layer after the loop, with collectives of its own
    return {"demo": ROOT / "examples" / "demo-lm", "moe": moe, "mtp": random_mtp("qwen3_5")}


def _jobs(models: dict[str, Path], out: Path, nproc: int) -> list[tuple[list[str], Path | None]]:
    jobs = [(["quantize", src, "-o", out / f"{m}-{r}", "-q", *args], None)
            for m, src in models.items() for r, args in RECIPES.items()]
    jobs.append((["quantize", models["demo"], "-o", out / "demo-awq", "-q", *AWQ], None))
    jobs += [(["quantize", models[m], "-o", out / f"{m}-signround", "-q", *SIGNROUND], None) for m in ("demo", "moe")]
    jobs.append((["quantize", models["demo"], "-o", out / "demo-gptq-noprop", "-q", *RECIPES["gptq"],
                  "--set", "calibrate.propagate=false"], None))
    # W4A4 RTN observed through the quantized layers: each layer's input amax read on every rank
    # (Recorders.amax_now, a collective) to quantize its inputs on the rerun
    jobs.append((["quantize", models["demo"], "-o", out / "demo-calibrated-prop", "-q", *RECIPES["calibrated"],
                  "--set", "calibrate.propagate=true"], None))
    jobs.append((["eval", out / "demo-calibrated", "--reference", models["demo"], "--max-tokens", "2560",
                  "--seq-len", "64", "--batch-size", "3", "--layer-kl", "--text", ROOT / "README.md", "--json", "-q"],
                 out / "eval.json"))
    if nproc <= 2:
        jobs.append((["distill", models["demo"], "-o", out / "demo-distill", "-q", *DISTILL], None))
    return jobs


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> Path:
    """The one-process artifacts and figures (the CLI in this process)."""
    import contextlib

    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("one")
    for argv, stdout in _jobs(models, out, 1):
        with open(stdout or "/dev/null", "w") as f, contextlib.redirect_stdout(f):
            assert main([str(a) for a in argv]) == 0, argv
    return out


@pytest.mark.parametrize("nproc", [2, 3])
def test_n_processes_write_the_one_process_artifact(nproc, models, reference, tmp_path):
    res = run_matrix(nproc, _jobs(models, tmp_path, nproc), tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    jobs = sorted(p.name for p in reference.iterdir() if p.is_dir() and (nproc <= 2 or "distill" not in p.name))
    assert len(jobs) == 14 + (nproc <= 2)
    for job in jobs:
        one, many = tree(reference / job), tree(tmp_path / job)
        assert sorted(many) == sorted(one), job
        differ = [f for f in one if one[f] != many[f]]
        assert not differ, f"{job}: {differ} differ between 1 and {nproc} processes"
    mtp = json.loads((reference / "mtp-calibrated" / "tfcompile" / "manifest.json").read_text())["layers"]
    assert [la["scale_search"] for la in mtp if la["module"].startswith("mtp.")]  # MTP layer calibrated, searched
    for job in ("demo-gptq", "moe-gptq", "demo-gptq-noprop", "mtp-gptq"):
        gptq = (reference / job / "tfcompile" / "manifest.json").read_text()
        assert '"algorithm": "gptq"' in gptq, job  # the solves ran (not an RTN fallback)
    prop, noprop = (tree(reference / j) for j in ("demo-gptq", "demo-gptq-noprop"))
    assert any(prop[f] != noprop[f] for f in prop if f.endswith(".safetensors"))  # propagation changed codes
    prop, noprop = (tree(reference / j) for j in ("demo-calibrated-prop", "demo-calibrated"))
    assert any(prop[f] != noprop[f] for f in prop if f.endswith(".safetensors"))  # and input scales
    from tfcompile.cli.main import main

    for m in ("demo", "moe"):  # the blocks were tuned: codes other than round-to-nearest's
        plain = tmp_path / "plain" / m
        assert main(["quantize", str(models[m]), "-o", str(plain), "--format", "nvfp4a16", "-q"]) == 0
        rtn, tuned = tree(plain), tree(reference / f"{m}-signround")
        assert any(rtn[f] != tuned[f] for f in tuned if f.endswith(".safetensors")), m
    awq = json.loads((reference / "demo-awq" / "tfcompile" / "manifest.json").read_text())
    assert '"algorithm": "awq"' in json.dumps(awq)  # folded groups, not all skipped
    one, many = (json.loads((d / "eval.json").read_text()) for d in (reference, tmp_path))
    for doc in (one, many):
        for key in ("seconds", "model"):  # wall time; the path of each run's own output
            doc.pop(key)
    assert len(one["layer_kl"]) == 4 and one["layer_kl"][-1]["kl_mean"] > 0
    assert many == one  # every figure, as floats: bit for bit
