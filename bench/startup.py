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

    python bench/startup.py [--repeat 7] [--rtn-repeat 5] [--skip-rtn] [--before REV] [--profile]
                            [--llmc-python PY] [--write-docs]

--llmc-python PY also runs llm-compressor's data-free NVFP4A16 RTN (QuantizationModifier, bench/peers_llmc.py,
in its own venv: `python3 -m venv V && V/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1`) on the same
checkpoint in the same alternating rounds; target (issue 32): tfcompile at least 10x faster with at most 1/4
of its peak RSS.

--before REV also runs the code of another commit (git archive into a temp dir, `python -m tfcompile`
with PYTHONPATH on it) in the same interleaved rounds: the change measured against where it started.
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

from common import (Timed, cpu_busy, machine_description, machine_line, median, replace_doc_section,  # noqa: E402
                    require_gnu_time, run_timed)
from quantize import (BASELINE_SRC, clear_output, make_checkpoint, profile_run, safetensors_files,  # noqa: E402
                      tfcompile_argv, warm_page_cache)

DOC_HEADING = "## Start-up and data-free RTN vs the read floor"
STARTUP_LIMIT_S = 0.5
RTN_MAX_RATIO = 1.5
LLMC_MIN_SPEEDUP, LLMC_MAX_RSS = 10.0, 0.25  # tfcompile vs llm-compressor, issue 32
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


def _argv(label: str, before: Path | None = None) -> list[str]:
    if label == "python -c pass":
        return [sys.executable, "-c", "pass"]
    if label.startswith("python -c"):
        return [sys.executable, "-c", "import torch"]
    return [*_tfcompile(before), *STARTUP[label]]


def _tfcompile(before: Path | None) -> list[str]:
    """The installed console script, or the code of another tree (--before: `python -m tfcompile` with
    PYTHONPATH set to it, see _env)."""
    return tfcompile_argv() if before is None else [sys.executable, "-m", "tfcompile"]


def _env(before: Path | None) -> dict:
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = str(before)
    return env


def _once(argv: list[str], env: dict | None = None, cwd: Path | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 2):
        sys.exit(f"error: {argv} exited {p.returncode}")
    return wall


def bench_startup(repeat: int, before: Path | None) -> list[dict]:
    """Interleaved rounds of every command (and, with --before, every tfcompile command of that tree)."""
    cases = [(k, None) for k in STARTUP] + [(k, before) for k in STARTUP if before and STARTUP[k]]
    runs: dict[tuple, list[float]] = {c: [] for c in cases}
    for r in range(repeat + 1):  # round 0 untimed: the files in the page cache, .pyc written
        for k, tree in cases:
            wall = _once(_argv(k, tree), _env(tree), cwd=tree)  # (`-m` puts the cwd first on sys.path)
            if r:
                runs[(k, tree)].append(wall)
    base, torch_s = median(runs[("python -c pass", None)]), median(runs[('python -c "import torch"', None)])
    return [{"what": k if tree is None else f"before: {k}", "median_s": median(v), "vs_pass": median(v) / base,
             "vs_torch": median(v) / torch_s, "runs": [round(x, 3) for x in v]} for (k, tree), v in runs.items()]


def startup_table(rows: list[dict]) -> str:
    out = ["| command | median | vs `python -c pass` | vs `import torch` | target |", "|---|---:|---:|---:|---|"]
    for r in rows:
        target = "" if r["what"].startswith(("python", "before")) else \
            ("ok" if r["median_s"] < STARTUP_LIMIT_S else "**missed**") + f" (< {STARTUP_LIMIT_S} s)"
        out.append(f"| `{r['what']}` | {r['median_s']:.3f} s | {r['vs_pass']:.1f}x | {r['vs_torch']:.2f}x | {target} |")
    return "\n".join(out)


def _llmc_argv(python: str, model: Path, out: Path) -> list[str]:
    return [python, str(Path(__file__).resolve().parent / "peers_llmc.py"), str(model), str(out),
            "--scheme", "NVFP4A16", "--method", "rtn"]


def bench_rtn(repeat: int, profile: bool, before: Path | None, llmc: str | None = None) -> tuple[dict, str]:
    """Alternating runs: the read floor, tfcompile (and the --before tree, and llm-compressor with
    `llmc`); the first tfcompile run of each tree builds the C kernels into an empty TFCOMPILE_CACHE."""
    work = Path(tempfile.mkdtemp(prefix="tfc-startup-", dir="/tmp"))
    try:
        model = make_checkpoint(work / "llama-0.9b", 0, shape=SHAPE_09B, layers=LAYERS_09B)
        files = safetensors_files(model)
        print(f"warming the page cache: {warm_page_cache(files):.2f} s", file=sys.stderr)
        trees = {"tfcompile": None, **({"before": before} if before else {})}
        argv = {name: [*_tfcompile(t), "quantize", "--format", "nvfp4a16", str(model), "-o", str(work / "out"),
                       "--overwrite", "-q"] for name, t in trees.items()}
        envs = {name: {**_env(t), "TFCOMPILE_CACHE": str(work / f"cache-{name}")} for name, t in trees.items()}
        runs: dict[str, list[Timed]] = {"floor": [], **{name: [] for name in trees}, **({"llmc": []} if llmc else {})}
        loads = []  # the 1-minute load average after each round: the machine is shared
        for r in range(repeat):
            runs["floor"].append(_checked(run_timed([sys.executable, "-c", BASELINE_SRC, *map(str, files)])))
            for name in trees:
                clear_output(work / "out")
                runs[name].append(_checked(run_timed(argv[name], env=envs[name],
                                                     cwd=str(trees[name]) if trees[name] else None)))
                print(f"  run {r + 1}/{repeat}: floor {runs['floor'][-1].wall_s:.2f} s, {name} "
                      f"{runs[name][-1].wall_s:.2f} s (load {_load()})", file=sys.stderr)
            if llmc:
                clear_output(work / "out")
                runs["llmc"].append(_checked(run_timed(_llmc_argv(llmc, model, work / "out"))))
                print(f"  run {r + 1}/{repeat}: llm-compressor {runs['llmc'][-1].wall_s:.2f} s", file=sys.stderr)
            clear_output(work / "out")
            loads.append(float(_load()))
        prof = profile_run(model, work, envs["tfcompile"]) if profile else ""
        return {"runs": runs, "bytes": sum(f.stat().st_size for f in files), "loads": loads}, prof
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _checked(t: Timed) -> Timed:
    if t.rc != 0:
        sys.exit(f"error: {t.argv} exited {t.rc}:\n{t.stderr_tail}")
    return t


def rtn_table(res: dict) -> str:
    runs = res["runs"]
    floor = median([t.wall_s for t in runs["floor"]])
    out = ["| what | wall median | vs read floor | target | CPU user+sys median | peak RSS | wall per run |",
           "|---|---:|---:|---|---:|---:|---|"]
    for name, ts in runs.items():
        wall = median([t.wall_s for t in ts])
        target = "" if name != "tfcompile" else \
            ("ok" if wall / floor <= RTN_MAX_RATIO else "**missed**") + f" (<= {RTN_MAX_RATIO}x)"
        label = {"floor": "read floor (`import torch` + read every file)", "tfcompile": "tfcompile (this tree)",
                 "before": "tfcompile before (--before tree)",
                 "llmc": "llm-compressor 0.14 RTN NVFP4A16 (own venv)"}[name]
        out.append(f"| {label} | {wall:.2f} s | **{wall / floor:.2f}x** | {target} | "
                   f"{median([t.user_s + t.sys_s for t in ts]):.2f} s | {max(t.max_rss_bytes for t in ts) / 1e9:.2f} GB "
                   f"| {[round(t.wall_s, 2) for t in ts]} |")
    return "\n".join(out) + (llmc_line(runs) if "llmc" in runs else "")


def llmc_line(runs: dict) -> str:
    """tfcompile against llm-compressor on the same checkpoint, same rounds: speed-up and RSS share."""
    wall = {k: median([t.wall_s for t in runs[k]]) for k in ("tfcompile", "llmc")}
    cpu = {k: median([t.user_s + t.sys_s for t in runs[k]]) for k in ("tfcompile", "llmc")}
    rss = {k: max(t.max_rss_bytes for t in runs[k]) for k in ("tfcompile", "llmc")}
    speed, share = wall["llmc"] / wall["tfcompile"], rss["tfcompile"] / rss["llmc"]
    ok = lambda c: "met" if c else "**missed**"  # noqa: E731
    return (f"\n\ntfcompile vs llm-compressor: **{speed:.1f}x faster** (wall; CPU {cpu['llmc'] / cpu['tfcompile']:.1f}x), "
            f"target >= {LLMC_MIN_SPEEDUP:.0f}x: {ok(speed >= LLMC_MIN_SPEEDUP)}; peak RSS **{share:.2f}** of "
            f"llm-compressor's, target <= {LLMC_MAX_RSS}: {ok(share <= LLMC_MAX_RSS)}.")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def cpu_flags() -> str:
    """The vector / matrix extensions torch's CPU kernels can use here, from /proc/cpuinfo."""
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    names = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512_BF16", "amx_tile": "AMX"}
    return " + ".join(v for k, v in names.items() if k in flags) or "no AVX2"


def before_tree(rev: str, into: Path) -> Path:
    """`git archive REV` unpacked into `into`, laid out as the package imports it (passes/, kernels/,
    calibration/ linked under tfcompile/, as pyproject's package-dir maps them)."""
    repo = Path(__file__).resolve().parents[1]
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for sub in ("passes", "kernels", "calibration"):
        (into / "tfcompile" / sub).symlink_to(into / sub)
    return into


def docs_body(cmd: str, startup: list[dict], rtn: dict | None, machine: str, load: str, busy: float,
              before: str | None) -> str:
    parts = [f"Command: `{cmd}`", "",
             f"Machine: {machine}; CPU extensions {cpu_flags()}. Load average {load} when the bench started and "
             f"{busy:.2f} cores used by other processes just before it" + (
                 ": idle." if busy < 0.2 else ": the machine was shared with other jobs and not idle, so absolute "
                 "seconds are inflated (up to ~2x); the ratios compare commands of the same run, interleaved."), "",
             "Start-up, each command a fresh process, medians (`tfcompile`: the installed console script"
             + (f"; `before:` the same command with the code of commit `{before}`, `python -m tfcompile`" if before
                else "") + "):", "",
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
                  f"(bench/quantize.py's baseline); runs alternate, medians of {len(rtn['runs']['floor'])} (the "
                  f"first tfcompile run of each tree builds the C kernels; load average {min(rtn['loads']):.1f}-"
                  f"{max(rtn['loads']):.1f} during the runs):", "", rtn_table(rtn)]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each start-up command [default: 7]")
    ap.add_argument("--rtn-repeat", type=int, default=5, help="runs of the read floor and of RTN [default: 5]")
    ap.add_argument("--skip-rtn", action="store_true", help="only the start-up part")
    ap.add_argument("--before", metavar="REV", help="also run the code of this git revision (git archive)")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one RTN run")
    ap.add_argument("--llmc-python", metavar="PY", help="also run llm-compressor's RTN with this venv's python")
    ap.add_argument("--write-docs", action="store_true", help=f"write '{DOC_HEADING[3:]}' in docs/performance.md")
    args = ap.parse_args(argv)
    require_gnu_time()
    machine, load, busy = machine_line(machine_description()), _load(), cpu_busy()
    print(f"machine: {machine}; {cpu_flags()}; load {load}; others {busy:.2f} cores", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="tfc-before-", dir="/tmp"))
    try:
        before = before_tree(args.before, scratch / "tree") if args.before else None
        startup = bench_startup(args.repeat, before)
        print(startup_table(startup))
        rtn, prof = (None, "") if args.skip_rtn else bench_rtn(args.rtn_repeat, args.profile, before, args.llmc_python)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if rtn is not None:
        print("\n" + rtn_table(rtn))
    if prof:
        print(prof)
    if args.write_docs:
        cmd = "python bench/startup.py " + " ".join(argv if argv is not None else sys.argv[1:])
        path = replace_doc_section(DOC_HEADING, docs_body(cmd.strip(), startup, rtn, machine, load, busy, args.before))
        print(f"updated {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
