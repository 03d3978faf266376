"""Bench: one process vs two (torchrun, gloo) on this machine, RTN and calibration (issue #17).

    python bench/dist.py [--repeat 3] [--write-docs]

On the synthetic 1.1B Llama of bench/estimate.py (16 layers, hidden 2048): `tfcompile
quantize` against `torchrun --standalone --nproc-per-node 2 -m tfcompile quantize`, runs
alternating, medians: nvfp4a16 RTN with the default 4 GiB shards (one shard: rank 0 writes
it all), RTN with 128 MiB shards (each rank writes half), and nvfp4 calibrated on 8 x 256
random tokens (2 batches of 4: one per rank). Wall time of the whole command, and the pass
that does the work (rank 0's --json). Both artifacts are compared byte for byte. Then what
the cost model (tfcompile/estimate) gives for the same recipes on 1 and 8 H200s.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
from pathlib import Path

from common import git_revision, machine_line, median, replace_doc_section, require_gnu_time, run_timed, wait_idle  # noqa: E402
from estimate import CALIB, SHAPE_1B, WORK  # noqa: E402
from quantize import make_checkpoint, tfcompile_argv  # noqa: E402

HEADING = "## Many processes: 1 vs 2 on this machine"
CASES = {  # name -> (options, pass)
    "rtn, 1 shard": (["--format", "nvfp4a16"], "pack"),
    "rtn, 128 MiB shards": (["--format", "nvfp4a16", "--set", "pack.max_shard_mb=128"], "pack"),
    "calibrated nvfp4": (["--format", "nvfp4", *CALIB], "calibrate"),
}


def _torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m", "tfcompile"]


def _run(prefix: list[str], model: Path, out: Path, opts: list[str], pass_name: str) -> tuple[float, float]:
    doc_path = WORK / "dist-run.json"
    t = run_timed([*prefix, "quantize", str(model), "-o", str(out), "--overwrite", *opts, "--json", "-q"],
                  stdout=doc_path)
    if t.rc:
        sys.exit(f"failed ({t.rc}): {t.stderr_tail}")
    return t.wall_s, json.loads(doc_path.read_text())["passes"][pass_name]["seconds"]


def _same(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and \
        all(filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def _estimates(model: Path, opts: list[str], pass_name: str) -> dict:
    out = {}
    for devices in ("cpu", "2xcpu", "1xH200", "8xH200"):
        path = WORK / "dist-estimate.json"
        t = run_timed([*tfcompile_argv(), "plan", str(model), *opts, "--estimate", "--devices", devices, "--json"],
                      stdout=path)
        if t.rc:
            sys.exit(f"plan --estimate failed: {t.stderr_tail}")
        out[devices] = json.loads(path.read_text())["passes"][pass_name]["seconds"]
    return out


def bench(repeat: int, wait: float) -> list[dict]:
    model = make_checkpoint(WORK / "llama-1b-16", 0, shape=SHAPE_1B, layers=16)
    results = []
    for name, (opts, pass_name) in CASES.items():
        walls = {1: [], 2: []}
        passes = {1: [], 2: []}
        busy = []
        for _ in range(repeat):
            for n in (1, 2):
                busy.append(wait_idle(wait))
                prefix = tfcompile_argv() if n == 1 else _torchrun(2)
                w, p = _run(prefix, model, WORK / f"dist-out-{n}", opts, pass_name)
                walls[n].append(w)
                passes[n].append(p)
        results.append({"case": name, "pass": pass_name, "wall_s": {n: median(v) for n, v in walls.items()},
                        "pass_s": {n: median(v) for n, v in passes.items()}, "runs": {"wall": walls, "pass": passes},
                        "identical": _same(WORK / "dist-out-1", WORK / "dist-out-2"), "busy_cores": busy,
                        "estimate_s": _estimates(model, opts, pass_name)})
    return results


def _markdown(results: list[dict], repeat: int) -> str:
    lines = [f"`python bench/dist.py --repeat {repeat} --write-docs` ({machine_line()}, commit "
             f"{git_revision()}), the synthetic 1.1B Llama (16 layers, hidden 2048, 2.2 GB bf16). One process "
             "(`tfcompile quantize`) against two (`torchrun --standalone --nproc-per-node 2 -m tfcompile quantize`, "
             "gloo, one thread each), runs alternating, medians. The two artifacts are compared byte for byte.", "",
             "| case | pass | 1 process: wall / pass s | 2 processes: wall / pass s | pass speed-up | identical |",
             "|---|---|---|---|---|---|"]
    for r in results:
        w, p = r["wall_s"], r["pass_s"]
        lines.append(f"| {r['case']} | {r['pass']} | {w[1]:.1f} / {p[1]:.1f} | {w[2]:.1f} / {p[2]:.1f} | "
                     f"{p[1] / p[2]:.2f}x | {'yes' if r['identical'] else 'NO'} |")
    busy = [b for r in results for b in r["busy_cores"]]
    lines += ["", f"Other load during the runs: {min(busy):.1f}-{max(busy):.1f} busy cores of 2.", "",
              "The cost model (`tfcompile plan --estimate`, same recipes) for this machine and for H200 nodes:", "",
              "| case | pass | cpu | 2xcpu | 1xH200 | 8xH200 |", "|---|---|---|---|---|---|"]
    for r in results:
        e = r["estimate_s"]
        lines.append(f"| {r['case']} | {r['pass']} | {e['cpu']:.1f} | {e['2xcpu']:.1f} | {e['1xH200']:.2f} | "
                     f"{e['8xH200']:.2f} |")
    calib = next((r["pass_s"][1] / r["pass_s"][2] for r in results if r["pass"] == "calibrate"), 1.0)
    lines += ["", "Why RTN gains nothing and calibration gained here: this machine has 2 vCPUs, and one process "
              "already uses both (two torch threads for calibration's GEMMs; a quantizing thread, the writer and "
              "the source hash in pack). Two processes get one thread each, so the same CPU work is split two ways "
              "on the same two cores, plus a second interpreter start (torch, transformers: the 5-8 s of extra wall "
              "time above), the store's barriers and gloo traffic; with one output shard rank 1 has nothing to "
              "write, and with 128 MiB shards each rank writes half on the same disk. Calibration ran "
              f"{calib:.1f}x faster on two processes in these runs; above 1x only because the machine was "
              f"overloaded (other jobs kept {max(busy):.1f} cores busy): a "
              "one-process layer forward is many small ops, each an OpenMP region whose two threads wait for each "
              "other on oversubscribed cores (measured: a layer's norms, RoPE and observers take 7-150x their "
              "one-thread time under this load, docs \"Resource estimates\"); one thread per process has no such "
              "waits. On an idle 2-core machine expect about 1x. The cost model (second table) predicts no gain for "
              "either on this machine ('2xcpu' = 'cpu': the same cores) and a loss for RTN with one shard (it "
              "models one rank on one core writing everything; the measured pass took the same time: one "
              "process's pack does not keep two cores busy either). What it says for GPUs is the next section."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    require_gnu_time()
    results = bench(args.repeat, args.wait)
    print(json.dumps(results, indent=2))
    (WORK / "dist-results.json").write_text(json.dumps(results, indent=2))
    if args.write_docs:
        print(replace_doc_section(HEADING, _markdown(results, args.repeat)), file=sys.stderr)


if __name__ == "__main__":
    main()
