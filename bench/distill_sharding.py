"""Bench: distillation on two processes, DDP vs FSDP2 (`--sharding`), peak memory per rank.

    python bench/distill_sharding.py [--repeat 3] [--write-docs]

A synthetic bf16 Llama (bench/quantize.py `make_checkpoint`: 8 layers, hidden 1024,
intermediate 2816, vocab 8000: 0.12B parameters, untied embeddings) distilled for 2 steps
(nvfp4a16, AdamW, --train weights, batch 2 x grad-accum 2 x 64 tokens of random ids, no held-out
figures) by `torchrun --standalone --nproc-per-node 2 -m tfcompile distill --sharding ddp|fsdp`,
runs alternating, medians. Peak RSS is GNU time's for the torchrun command: the largest single
process of the run, i.e. the larger rank (the CPU is the device here, so it is the model state
plus the interpreter, torch and transformers). Both artifacts are compared byte for byte. Beside
it, what `tfcompile plan --estimate --devices 2xcpu` (tfcompile/distill/memory.py) says the model
state per rank is, and the host's peak per rank (under FSDP2 the models are built unit by unit from
the checkpoint: tfcompile/distill/lazy.py).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
from pathlib import Path

from common import git_revision, machine_line, median, replace_doc_section, require_gnu_time, run_timed, wait_idle  # noqa: E402
from quantize import make_checkpoint, tfcompile_argv  # noqa: E402

WORK = Path("/tmp/tfc-bench-distill-sharding")
HEADING = "## Distillation on two processes: DDP vs FSDP2"
SHAPE = dict(hidden=1024, intermediate=2816, heads=16, kv_heads=4, vocab=8000)
LAYERS = 8
OPTS = ["--format", "nvfp4a16", "--steps", "2", "--batch", "2", "--grad-accum", "2", "--data", "random",
        "--set", "distill.seq_len=64", "--set", "distill.heldout_tokens=0"]


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "tfcompile"]


def _same(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and \
        all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def _estimate(model: Path, mode: str) -> dict:
    path = WORK / f"estimate-{mode}.json"
    t = run_timed([*tfcompile_argv(), "plan", str(model), *OPTS[:2], "--set", "distill.steps=2", "--estimate",
                   "--set", f"distill.sharding={mode}", "--devices", "2xcpu", "--json"], stdout=path)
    if t.rc:
        sys.exit(f"plan --estimate failed: {t.stderr_tail}")
    return json.loads(path.read_text())["passes"]["distill"]


def bench(repeat: int, wait: float) -> dict:
    model = make_checkpoint(WORK / "llama-0.1b-8", 0, shape=SHAPE, layers=LAYERS)
    runs = {"ddp": {"rss": [], "wall": []}, "fsdp": {"rss": [], "wall": []}}
    busy = []
    for _ in range(repeat):
        for mode in runs:
            busy.append(wait_idle(wait))
            t = run_timed([*_torchrun(), "distill", str(model), "-o", str(WORK / f"out-{mode}"), "--overwrite", "-q",
                           *OPTS, "--sharding", mode])
            if t.rc:
                sys.exit(f"{mode} failed ({t.rc}): {t.stderr_tail}")
            runs[mode]["rss"].append(t.max_rss_kib * 1024)
            runs[mode]["wall"].append(t.wall_s)
    return {"runs": runs, "busy": busy, "identical": _same(WORK / "out-ddp", WORK / "out-fsdp"),
            "estimate": {mode: _estimate(model, mode) for mode in runs}}


def _markdown(r: dict, repeat: int) -> str:
    rss = {m: median(v["rss"]) / 1e9 for m, v in r["runs"].items()}
    wall = {m: median(v["wall"]) for m, v in r["runs"].items()}
    e = r["estimate"]["ddp"]  # the model state of both modes (the same in either file)
    host = {m: v["host_gb"] for m, v in r["estimate"].items()}
    return "\n".join([
        f"`python bench/distill_sharding.py --repeat {repeat} --write-docs` ({machine_line()}, commit "
        f"{git_revision()}): a synthetic Llama of 0.12B parameters (8 layers, hidden 1024, vocab 8000) distilled "
        "2 steps (nvfp4a16, AdamW, batch 2 x grad-accum 2 x 64 tokens) on `torchrun --nproc-per-node 2`, gloo, "
        "runs alternating, medians. Peak RSS: the larger rank's (GNU time on torchrun); the CPU is the device.", "",
        "| sharding | peak RSS per rank GB | wall s | model state per rank GB (`plan --estimate --devices 2xcpu`) "
        "| host per rank GB (plan's, building included) |",
        "|---|---|---|---|---|",
        f"| ddp | {rss['ddp']:.2f} | {wall['ddp']:.1f} | {e['ddp_gb_per_rank']:.2f} | {host['ddp']:.2f} |",
        f"| fsdp | {rss['fsdp']:.2f} | {wall['fsdp']:.1f} | {e['fsdp_gb_per_rank']:.2f} | {host['fsdp']:.2f} |", "",
        f"FSDP2 / DDP peak RSS: {rss['fsdp'] / rss['ddp']:.2f}; the difference, {rss['ddp'] - rss['fsdp']:.2f} GB, "
        f"against the estimate's {e['ddp_gb_per_rank'] - e['fsdp_gb_per_rank']:.2f} GB of model state. The artifacts "
        f"are {'byte-identical' if r['identical'] else 'NOT identical'}. Other load during the runs: "
        f"{min(r['busy']):.1f}-{max(r['busy']):.1f} busy cores of 2 (wall times are noisy on this shared "
        "machine; FSDP2's per-layer all-gathers and reduce-scatters go through gloo over loopback). Runs: "
        + ", ".join(f"{m} RSS {[round(x / 1e9, 2) for x in v['rss']]} GB, wall {[round(x, 1) for x in v['wall']]} s"
                    for m, v in r["runs"].items()) + "."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for an idle machine before each run")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    require_gnu_time()
    WORK.mkdir(parents=True, exist_ok=True)
    text = _markdown(bench(args.repeat, args.wait), args.repeat)
    print(text)
    if args.write_docs:
        print(f"wrote {replace_doc_section(HEADING, text)}", file=sys.stderr)


if __name__ == "__main__":
    main()
