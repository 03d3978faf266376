"""Run several `tfcompile` commands in one torchrun launch (one process group, one interpreter
start per rank): `torchrun ... tests/dist/run_matrix.py JOBS.json`. JOBS.json is a list of
{"argv": [...], "stdout": FILE or null}; each command goes through the real CLI entry
(`tfcompile.cli.main.main`), exactly as `torchrun -m tfcompile ...` runs it, its stdout (rank
0's --json) into FILE. The first failure's exit code is this script's."""

import contextlib
import json
import sys

from tfcompile.cli.main import main

if __name__ == "__main__":
    for job in json.loads(open(sys.argv[1]).read()):
        with open(job["stdout"] or "/dev/null", "a") as out, contextlib.redirect_stdout(out):
            code = main(job["argv"])
        if code:
            sys.exit(code)
