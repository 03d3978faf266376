"""Write the tiny demo checkpoint committed under examples/tiny-llama.

    python scripts/make_tiny_llama.py examples/tiny-llama [--overwrite]

A random-init Llama (hidden 128, intermediate 256, 2 layers, 4 heads, 2 KV
heads, vocab 512, bf16; about 0.9 MB) with a tiny BPE tokenizer. Output bytes
are deterministic, so rerunning it leaves git clean. The builder lives in
tests/fixtures/models.py, shared with the tests; it is loaded by path so this
script needs no test package on sys.path.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def _load_models():
    spec = importlib.util.spec_from_file_location("tfcompile_test_models", REPO / "tests" / "fixtures" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to create, e.g. examples/tiny-llama")
    parser.add_argument("--overwrite", action="store_true", help="replace out_dir if it exists")
    args = parser.parse_args(argv)
    if args.out_dir.exists():
        if not args.overwrite:
            print(f"error: {args.out_dir} already exists\nhint: pass --overwrite to replace it", file=sys.stderr)
            return 1
        shutil.rmtree(args.out_dir)
    _load_models().make_tiny_llama(
        args.out_dir, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2, vocab=512, dtype=torch.bfloat16
    )
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
