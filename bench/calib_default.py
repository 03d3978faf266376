"""Bench: what the default calibration data costs (issue #19: at most 1.2x of `--calib FILE`).

`tfcompile quantize --format nvfp4 SmolLM2 -o OUT` with default settings (16 x 128 calibration
tokens, `calibrate.data` auto) against the same command with `--calib FILE` (a .txt file of the
same kind of text, the python-doc calib split, one document per line) and the same samples x
length, and against `--calib self` (sequences the model samples, calibration/sampling.py).
Each is the whole process, wall seconds, runs interleaved (default, file, self, default, ...);
medians; the machine's busy cores (other jobs) are recorded before every run, since this 2-core
machine is shared: a ratio from interleaved runs under the same load is what the bench reports.

    python bench/calib_default.py [--repeat 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_busy, git_revision, machine_line, median, replace_doc_section, run_timed  # noqa: E402

HEADING = "## Calibration: the default data source"
MAX_RATIO = 1.2


def calib_file(path: Path) -> Path:
    from tfcompile.calibration.corpus import python_doc_texts

    path.write_text("\n".join(" ".join(t.split()) for t in python_doc_texts("calib")) + "\n")
    return path


def run(model: Path, out: Path, extra: list[str]) -> dict:
    argv = ["tfcompile", "quantize", str(model), "-o", str(out), "--format", "nvfp4", "--json", "--overwrite", "-q",
            *extra]
    busy = cpu_busy(0.5)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        t = run_timed(argv, stdout=Path(f.name))
        if t.rc != 0:
            raise SystemExit(f"failed: {' '.join(argv)}\n{t.stderr_tail}")
        doc = json.loads(Path(f.name).read_text())
    cal = doc["passes"]["calibrate"]
    return {"wall_s": t.wall_s, "cpu_s": t.user_s + t.sys_s, "busy": busy, "source": cal["source"],
            "calibrate_s": cal["seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    model = smollm2_checkpoint()
    work = Path(tempfile.mkdtemp(prefix="tfc-calib-default-"))
    try:
        txt = calib_file(work / "calib.txt")
        modes = {"default": [], "file": ["--calib", str(txt)], "self": ["--calib", "self"]}
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for i in range(args.repeat):
            for mode, extra in modes.items():
                r = run(model, work / "out", extra)
                runs[mode].append(r)
                print(f"{mode:8s} run {i}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, calibrate "
                      f"{r['calibrate_s']:.1f} s, busy {r['busy']:.2f} cores ({r['source']})", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {m: {k: median([r[k] for r in rs]) for k in ("wall_s", "cpu_s", "calibrate_s", "busy")}
           for m, rs in runs.items()}
    body = report(med, runs, args.repeat)
    print(body)
    if args.write_docs:
        replace_doc_section(HEADING, body)
    return 0 if med["default"]["wall_s"] <= MAX_RATIO * med["file"]["wall_s"] else 1


def report(med: dict, runs: dict, repeat: int) -> str:
    lines = ["| data | source used | wall s (median) | CPU s | calibrate pass s | busy cores (other jobs) "
             "| vs --calib FILE |", "|---|---|---:|---:|---:|---:|---:|"]
    for m, label in (("default", "default (auto)"), ("file", "--calib FILE"), ("self", "--calib self")):
        r = med[m]
        lines.append(f"| {label} | {runs[m][0]['source']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{r['calibrate_s']:.1f} | {r['busy']:.2f} | {r['wall_s'] / med['file']['wall_s']:.2f}x |")
    return (f"Command: `python bench/calib_default.py --repeat {repeat} --write-docs`. `tfcompile quantize "
            f"--format nvfp4` on SmolLM2-135M-Instruct (tfcompile.fixtures.smollm2) with the default 16 x 128 "
            f"calibration tokens: default settings against `--calib FILE` (the python-doc calib split as a .txt "
            f"file) and `--calib self`, {repeat} interleaved runs each, medians, whole process. Machine: "
            f"{machine_line()}; revision {git_revision()}. Target (issue #19): default <= {MAX_RATIO}x "
            f"of --calib FILE.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
