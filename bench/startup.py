"""Bench: start-up of the CLI, and data-free RTN of a ~0.9B checkpoint against the read floor.

Targets (issue 32): `tfcompile --help`, a command's --help and its usage errors in under 0.5 s;
`tfcompile quantize --format nvfp4a16` (RTN, no data) of a ~0.9B Llama at most 1.5x of the read
floor: `python -c "import torch"` plus reading every safetensors file once (bench/quantize.py's
baseline, same run, warm page cache).

Start-up: each command a fresh process, timed around the process (perf_counter), runs interleaved
(pass, import torch, then each tfcompile command, repeated), medians; shown as seconds and as ratios
to `python -c pass` and `python -c "import torch"` of the same run.

RTN: a random bf16 Llama (hidden 2048, intermediate 5632, 32 heads, 4 KV heads, vocab 32000,
18 layers: 0.92B parameters, 1.85 GB) written by bench/quantize.py's make_checkpoint into a temp
dir under /tmp and deleted at the end; then bench/quantize.py's alternating baseline / tfcompile
runs (its first tfcompile run builds the C kernels: "cold").

    python bench/startup.py [--repeat 7] [--rtn-repeat 5] [--skip-rtn] [--profile] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_busy, machine_description, machine_line, median, replace_doc_section  # noqa: E402
from quantize import (bench_format, make_checkpoint, profile_run, require_gnu_time, safetensors_files,  # noqa: E402
                      summarize, tfcompile_argv, warm_page_cache)

DOC_HEADING = "## Start-up and data-free RTN vs the read floor"
STARTUP_LIMIT_S = 0.5
RTN_MAX_RATIO = 1.5
SHAPE_09B = dict(hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000)
LAYERS_09B = 18
# label -> argv after `tfcompile` (None: a plain Python reference)
STARTUP = {
    "python -c pass": None,
    'python -c "import torch"': None,
    "tfcompile --help": ["--help"],
    "tfcompile quantize --help": ["quantize", "--help"],
    "tfcompile quantize (usage error: no MODEL)": ["quantize"],
    "tfcompile eval --no-such-option (usage error)": ["eval", "--no-such-option"],
    "tfcompile draft --help": ["draft", "--help"],
}


def _argv(label: str) -> list[str]:
    if label == "python -c pass":
        return [sys.executable, "-c", "pass"]
    if label.startswith("python -c"):
        return [sys.executable, "-c", "import torch"]
    return [*tfcompile_argv(), *STARTUP[label]]


def _once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 2):
        sys.exit(f"error: {argv} exited {p.returncode}")
    return wall


def bench_startup(repeat: int) -> list[dict]:
    runs: dict[str, list[float]] = {k: [] for k in STARTUP}
    for k in STARTUP:  # one untimed round: the files in the page cache, .pyc written
        _once(_argv(k))
    for _ in range(repeat):
        for k in STARTUP:
            runs[k].append(_once(_argv(k)))
    base, torch_s = median(runs["python -c pass"]), median(runs['python -c "import torch"'])
    return [{"what": k, "median_s": median(v), "vs_pass": median(v) / base, "vs_torch": median(v) / torch_s,
             "runs": [round(x, 3) for x in v]} for k, v in runs.items()]


def startup_table(rows: list[dict]) -> str:
    out = ["| command | median | vs `python -c pass` | vs `import torch` | target |", "|---|---:|---:|---:|---|"]
    for r in rows:
        target = "" if r["what"].startswith("python") else \
            ("ok" if r["median_s"] < STARTUP_LIMIT_S else "**missed**") + f" (< {STARTUP_LIMIT_S} s)"
        out.append(f"| `{r['what']}` | {r['median_s']:.3f} s | {r['vs_pass']:.1f}x | {r['vs_torch']:.2f}x | {target} |")
    return "\n".join(out)


def bench_rtn(repeat: int, profile: bool) -> tuple[dict, str]:
    work = Path(tempfile.mkdtemp(prefix="tfc-startup-", dir="/tmp"))
    try:
        model = make_checkpoint(work / "llama-0.9b", 0, shape=SHAPE_09B, layers=LAYERS_09B)
        files = safetensors_files(model)
        env = {**os.environ, "TFCOMPILE_CACHE": str(work / "kernel-cache"), "PYTHONUNBUFFERED": "1"}
        print(f"warming the page cache: {warm_page_cache(files):.2f} s", file=sys.stderr)
        row = summarize(bench_format("nvfp4a16", model, files, work, repeat, env, idle_wait=0), budget=0)
        row["bytes"] = sum(f.stat().st_size for f in files)
        return row, (profile_run(model, work, env) if profile else "")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rtn_table(r: dict) -> str:
    verdict = "ok" if r["ratio"] <= RTN_MAX_RATIO else "**missed**"
    return ("| read floor median | tfcompile nvfp4a16 median | ratio | target | cold run | CPU user+sys | peak RSS |\n"
            "|---:|---:|---:|---|---:|---:|---:|\n"
            f"| {r['baseline_s']:.2f} s | {r['ours_s']:.2f} s | **{r['ratio']:.2f}x** | {verdict} (<= {RTN_MAX_RATIO}x) "
            f"| {r['cold_s']:.2f} s | {r['cpu_s']:.1f} s | {r['rss'] / 1e9:.2f} GB |\n\n"
            f"Per run (wall s, in order): read floor {r['runs_base']}; tfcompile {r['runs_ours']}.")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def docs_body(cmd: str, startup: list[dict], rtn: dict | None, machine: str, load: str, busy: float) -> str:
    parts = [f"Command: `{cmd}`", "",
             f"Machine: {machine}. Load average {load} when the bench started and {busy:.2f} cores used by other "
             "processes just before it: the machine was shared and not idle, so absolute seconds are high; "
             "the ratios compare commands of the same run.", "",
             "Start-up, each command a fresh process (medians; `tfcompile` is the installed console script):", "",
             startup_table(startup), "",
             "The CLI imports no command module for `--help` (tfcompile/cli/lazy.py lists them from a table) and a "
             "command's module imports torch, transformers, onnx and triton only when the command runs "
             "(tests/cli/test_startup.py guards this without a clock)."]
    if rtn is not None:
        parts += ["", f"Data-free RTN (`tfcompile quantize --format nvfp4a16 MODEL -o OUT --overwrite -q`) of a "
                  f"random bf16 Llama, {LAYERS_09B} layers of hidden {SHAPE_09B['hidden']}, intermediate "
                  f"{SHAPE_09B['intermediate']}, {SHAPE_09B['heads']} heads / {SHAPE_09B['kv_heads']} KV heads, vocab "
                  f"{SHAPE_09B['vocab']} (0.92B parameters, {rtn['bytes'] / 1e9:.2f} GB), warm page cache, against "
                  "the read floor: one process running `import torch` and reading every safetensors file once "
                  f"(bench/quantize.py's baseline), alternating, medians of {rtn['n']}:", "", rtn_table(rtn)]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each start-up command [default: 7]")
    ap.add_argument("--rtn-repeat", type=int, default=5, help="runs of the read floor and of RTN [default: 5]")
    ap.add_argument("--skip-rtn", action="store_true", help="only the start-up part")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one RTN run")
    ap.add_argument("--write-docs", action="store_true", help=f"write '{DOC_HEADING[3:]}' in docs/performance.md")
    args = ap.parse_args(argv)
    require_gnu_time()
    machine, load, busy = machine_line(machine_description()), _load(), cpu_busy()
    print(f"machine: {machine}; load {load}; others {busy:.2f} cores", file=sys.stderr)
    startup = bench_startup(args.repeat)
    print(startup_table(startup))
    rtn, prof = (None, "") if args.skip_rtn else bench_rtn(args.rtn_repeat, args.profile)
    if rtn is not None:
        print("\n" + rtn_table(rtn))
    if prof:
        print(prof)
    if args.write_docs:
        cmd = "python bench/startup.py " + " ".join(argv if argv is not None else sys.argv[1:])
        path = replace_doc_section(DOC_HEADING, docs_body(cmd.strip(), startup, rtn, machine, load, busy))
        print(f"updated {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
