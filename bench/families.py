"""The full family x format matrix: quantize, verify, eval and the transformers + compressed-tensors load,
on the tiny models of tests/fixtures/families.py (the CI runs a subset: tests/families/test_matrix.py).

    HF_HUB_OFFLINE=1 python bench/families.py [--families gpt_oss,qwen3] [--formats nvfp4,fp8] [--write-docs]

Per cell: quantize wall seconds (in-process, warm imports), `tfcompile verify`, `tfcompile eval` KL(ref || q)
and top-1 agreement on 512 held-out tokens, and the loader: transformers 5.24 + compressed-tensors with
`dequantize=True` compared with tfcompile's dequantized model bit for bit ("=" equal logits, "W" weights
differ, "E" the load raises). `--write-docs` replaces the "## Family x format matrix" section of
docs/models.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from common import machine_line, replace_doc_section  # noqa: E402

DOCS = ROOT / "docs" / "models.md"
HEADER = "## Family x format matrix"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the tests' helpers, loaded by path: tests/families/families_util.py imports tests/tests_helpers.py by name
sys.modules.setdefault("tests_helpers", _load(ROOT / "tests" / "tests_helpers.py", "tests_helpers"))
util = _load(ROOT / "tests" / "families" / "families_util.py", "families_util")


def loader_check(src: Path, art: Path) -> str:
    """"=" the loaded model equals ours, "W" its weights differ, "E" the load raises."""
    try:
        loaded = util.ct_load(art)
    except Exception:  # noqa: BLE001 - any loader failure is the finding
        return "E"
    ours = util.dequantized_reference(src, art)
    if util.weight_mismatches(loaded, ours):
        return "W"
    with torch.no_grad():
        return "=" if torch.equal(loaded(util.ids()).logits, ours(util.ids()).logits) else "W"


def cell(family: str, fmt: str, src: Path, root: Path) -> dict:
    t0 = time.perf_counter()
    art = util.quantize(src, root / f"{family}-{fmt}", fmt)
    seconds = time.perf_counter() - t0
    ok = util.run_cli("verify", art)[0] == 0
    code, out, err = util.run_cli("eval", art, "--reference", src, "--max-tokens", "512", "--seq-len", "64", "--json")
    metrics = json.loads(out)["metrics"] if code == 0 else {}
    return {"family": family, "format": fmt, "seconds": round(seconds, 2), "verify": ok,
            "kl": metrics.get("kl_mean"), "top1": metrics.get("top1_agreement"), "loader": loader_check(src, art)}


def table(rows: list[dict], fmts: list[str]) -> str:
    fams = list(dict.fromkeys(r["family"] for r in rows))
    by = {(r["family"], r["format"]): r for r in rows}
    head = "| family | " + " | ".join(fmts) + " |\n|---|" + "---|" * len(fmts) + "\n"
    lines = []
    for f in fams:
        cells = []
        for fmt in fmts:
            r = by.get((f, fmt))
            if r is None:
                cells.append("")
                continue
            mark = "ok" if r["verify"] and r["kl"] is not None else "FAIL"
            cells.append(f"{mark} {r['kl']:.4f} / {r['top1']:.2f} {r['loader']}" if r["kl"] is not None else mark)
        lines.append(f"| `{f}` | " + " | ".join(cells) + " |")
    return head + "\n".join(lines)


def main() -> int:
    fam_mod = _load(ROOT / "tests" / "fixtures" / "families.py", "families")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(fam_mod.FAMILIES))
    ap.add_argument("--formats", default=",".join(util.FORMATS))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    fams, fmts = args.families.split(","), args.formats.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfcompile-families-") as tmp:
        root = Path(tmp)
        for f in fams:
            src = fam_mod.FAMILIES[f].build(root / "src" / f)
            for fmt in fmts:
                rows.append(cell(f, fmt, src, root))
                print(json.dumps(rows[-1]), flush=True)
    body = (f"Written by `python bench/families.py --write-docs` ({machine_line()}). Each cell: verify, "
            "KL(ref || quantized) in nats / top-1 agreement on 512 held-out python-doc tokens (tiny random "
            "models: only the relative order means anything), and the transformers 5.24 + compressed-tensors "
            "0.20.1 load compared with tfcompile's dequantized model: `=` logits bit-identical, `W` its weights "
            "differ (a loader defect, below), `E` the load raises. Quantize seconds (in-process, median "
            f"{sorted(r['seconds'] for r in rows)[len(rows) // 2]:.1f} s per cell, "
            f"{sum(r['seconds'] for r in rows):.0f} s in all).\n\n" + table(rows, fmts))
    print(body)
    if args.write_docs:
        replace_doc_section(HEADER, body, DOCS)
    return 0 if all(r["verify"] and r["kl"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
