"""Bench: what the default calibration data costs (issue #19: at most 1.2x of `--calib FILE`).

`tfcompile quantize --format nvfp4 SmolLM2 -o OUT` with default settings (16 x 128 calibration
tokens, `calibrate.data` auto) against the same command with `--calib FILE` of the same kind of
text and the same samples x length, on a machine with python3.11-doc and on one without it:

- default: `auto` finds python-doc; file: the python-doc calib split as a .txt file (one
  document per line);
- default, no python-doc: `auto` with TFCOMPILE_PYTHON_DOC pointing at a missing folder, so it
  falls back to the standard library's docstrings (calibration/stdlib_text.py); file: the same
  docstrings as a .txt file, one file's docstrings per line;
- `--calib self` (sequences the model samples, calibration/sampling.py; auto's last resort).

Each is the whole process, wall and CPU seconds, runs interleaved (one of each mode per round);
medians; the machine's busy cores (other jobs) and 1-minute load average are recorded before
every run, since this 2-core machine is shared: a ratio from interleaved runs under the same
load is what the bench reports.

    python bench/calib_default.py [--repeat 3] [--write-docs] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from common import cpu_busy, git_revision, machine_line, median, replace_doc_section, run_timed  # noqa: E402

HEADING = "## Calibration: the default data source"
MAX_RATIO = 1.2


def calib_file(path: Path, texts) -> Path:
    """`texts` as a .txt calibration file: one document per line, whitespace runs collapsed."""
    path.write_text("\n".join(" ".join(t.split()) for t in texts) + "\n")
    return path


def run(model: Path, out: Path, extra: list[str], env: dict[str, str] | None) -> dict:
    argv = ["tfcompile", "quantize", str(model), "-o", str(out), "--format", "nvfp4", "--json", "--overwrite", "-q",
            *extra]
    busy, load = cpu_busy(0.5), os.getloadavg()[0]
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        t = run_timed(argv, env=env, stdout=Path(f.name))
        if t.rc != 0:
            raise SystemExit(f"failed: {' '.join(argv)}\n{t.stderr_tail}")
        doc = json.loads(Path(f.name).read_text())
    cal = doc["passes"]["calibrate"]
    return {"wall_s": t.wall_s, "cpu_s": t.user_s + t.sys_s, "busy": busy, "load1": load, "source": cal["source"],
            "calibrate_s": cal["seconds"]}


# mode -> (table label, the --calib FILE mode it is compared with)
MODES = {"default": ("default (`auto`, python-doc installed)", "file"),
         "file": ("`--calib FILE` (the python-doc calib split as .txt)", "file"),
         "nodoc": ("default (`auto`, no python-doc)", "file-stdlib"),
         "file-stdlib": ("`--calib FILE` (the stdlib docstrings as .txt)", "file-stdlib"),
         "self": ("`--calib self`", "file")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    ap.add_argument("--report", type=Path, metavar="JSON", help="no runs: the table of a --json file's runs "
                    "(the rounds it holds; e.g. of a run stopped early)")
    args = ap.parse_args()
    if args.report:
        return finish(json.loads(args.report.read_text()), args.write_docs, args.repeat)
    from tfcompile.calibration.corpus import python_doc_texts
    from tfcompile.calibration.stdlib_text import stdlib_texts
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    model = smollm2_checkpoint()
    work = Path(tempfile.mkdtemp(prefix="tfc-calib-default-"))
    nodoc = dict(os.environ, TFCOMPILE_PYTHON_DOC=str(work / "no-python3.11-doc"))
    try:
        extra = {"default": ([], None), "nodoc": ([], nodoc), "self": (["--calib", "self"], None),
                 "file": (["--calib", str(calib_file(work / "calib.txt", python_doc_texts("calib")))], None),
                 "file-stdlib": (["--calib", str(calib_file(work / "stdlib.txt", stdlib_texts()))], None)}
        runs: dict[str, list[dict]] = {m: [] for m in args.modes}
        for i in range(args.repeat):
            for mode in args.modes:
                r = run(model, work / "out", *extra[mode])
                runs[mode].append(r)
                print(f"{mode:12s} run {i}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, calibrate "
                      f"{r['calibrate_s']:.1f} s, busy {r['busy']:.2f} cores, load {r['load1']:.1f} "
                      f"({r['source']})", file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(runs, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finish(runs, args.write_docs, args.repeat)


def finish(runs: dict[str, list[dict]], write_docs: bool, repeat: int) -> int:
    """Print (and write) the table of `runs`; exit 1 if a default is above MAX_RATIO x its file's."""
    rounds = min(len(rs) for rs in runs.values())
    runs = {m: rs[:rounds] for m, rs in runs.items()}  # whole rounds only: the ratios compare like with like
    med = {m: {k: median([r[k] for r in rs]) for k in ("wall_s", "cpu_s", "calibrate_s", "busy", "load1")}
           for m, rs in runs.items()}
    body = report(med, runs, repeat, rounds)
    print(body)
    if write_docs:
        replace_doc_section(HEADING, body)
    worst = max(med[m]["wall_s"] / med[MODES[m][1]]["wall_s"] for m in ("default", "nodoc")
                if m in med and MODES[m][1] in med)
    return 0 if worst <= MAX_RATIO else 1


def report(med: dict, runs: dict, repeat: int, rounds: int) -> str:
    lines = ["| data | source used | wall s (runs) | wall s (median) | CPU s (median) | calibrate pass s (median) "
             "| busy cores / load (median) | vs its --calib FILE (wall / CPU) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for m, rs in runs.items():
        r, base = med[m], med.get(MODES[m][1])
        ratio = (f"{r['wall_s'] / base['wall_s']:.2f}x / {r['cpu_s'] / base['cpu_s']:.2f}x"
                 if base and MODES[m][1] != m else "1")
        walls = ", ".join(f"{x['wall_s']:.1f}" for x in rs)
        source = rs[0]["source"].rsplit("/", 1)[-1]  # a file's name, not its temporary folder
        lines.append(f"| {MODES[m][0]} | {source} | {walls} | "
                     f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['calibrate_s']:.1f} | {r['busy']:.2f} / "
                     f"{r['load1']:.1f} | {ratio} |")
    return (f"Command: `python bench/calib_default.py --repeat {repeat} --write-docs`. `tfcompile quantize "
            f"--format nvfp4` on SmolLM2-135M-Instruct (tfcompile.fixtures.smollm2) with the default 16 x 128 "
            f"calibration tokens: default settings, with python3.11-doc and without it (TFCOMPILE_PYTHON_DOC "
            f"pointing at a missing folder), each against `--calib FILE` of the same text as a .txt file, and "
            f"`--calib self`; {rounds} interleaved rounds"
            f"{'' if rounds == repeat else f' (of {repeat}: the table of the whole rounds done, --report)'}, "
            f"medians, whole process. Machine: {machine_line()}; "
            f"revision {git_revision()}. Target (issue #19): default <= {MAX_RATIO}x of --calib FILE.\n\n"
            + "\n".join(lines) + "\n\n" + verdict(med) + "\n")


def verdict(med: dict) -> str:
    """The target, checked for each default, in words."""
    parts = []
    for m, where, text in (("default", "With python3.11-doc", "python-doc"),
                           ("nodoc", "Without it", "the stdlib's docstrings")):
        if m in med and MODES[m][1] in med:
            base = med[MODES[m][1]]
            w, c = med[m]["wall_s"] / base["wall_s"], med[m]["cpu_s"] / base["cpu_s"]
            parts.append(f"{where}, the default ({text}) costs {w:.2f}x wall / {c:.2f}x CPU of "
                         f"`--calib FILE` of the same text: {'meets' if w <= MAX_RATIO else 'misses'} the "
                         f"{MAX_RATIO}x target.")
    if "self" in med and "file" in med:
        parts.append(f"`--calib self` (auto's last resort: no stdlib sources or a tokenizer that cannot encode "
                     f"English) costs {med['self']['wall_s'] / med['file']['wall_s']:.2f}x wall / "
                     f"{med['self']['cpu_s'] / med['file']['cpu_s']:.2f}x CPU of the python-doc file.")
    return " ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
