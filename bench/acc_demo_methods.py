"""Demo LM: four over six, SmoothQuant and rotations beside RTN and GPTQ on the same held-out tokens.

Runs bench/accuracy.py's `measure` (`tfcompile quantize`, then `tfcompile eval --max-tokens N`
against the bf16 demo LM) for each row and prints one JSON line per row; the figures are in
docs/accuracy.md "Demo LM: four over six, SmoothQuant, rotations".

    python bench/acc_demo_methods.py [--max-tokens 16384]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import accuracy  # noqa: E402

ROWS = [("nvfp4a16", a) for a in ("rtn", "4/6", "gptq", "rotate", "rotate+gptq")] + \
       [("nvfp4", a) for a in ("rtn", "4/6", "smoothquant", "gptq", "rotate", "rotate+gptq")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=16384)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for fmt, algo in ROWS:
            print(json.dumps(accuracy.measure(fmt, algo, Path(work), args.max_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
