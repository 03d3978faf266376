"""Regenerate docs/report.png: the demo LM quantized with every report section, shot in Chromium.

    python scripts/report_screenshot.py [--out docs/report.png] [--keep DIR]

Quantizes examples/demo-lm to nvfp4 with an FP8 KV cache, the TensorRT-LLM layout (TP 2),
kernels for sm_90a and sm_100a, and `--eval --report` on 4096 held-out tokens (needs
python3.11-doc), then screenshots OUT/tfcompile/report.html with headless Chromium.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "report.png")
    ap.add_argument("--keep", type=Path, help="build the artifact here (kept) instead of a temp dir")
    ap.add_argument("--height", type=int, default=2760, help="window height in px (the whole page)")
    args = ap.parse_args(argv)
    from tfcompile.cli.main import main as tfcompile
    from tfcompile.report import chromium

    with tempfile.TemporaryDirectory() as tmp:
        art = args.keep or Path(tmp) / "demo-lm-nvfp4"
        code = tfcompile(["quantize", str(REPO / "examples" / "demo-lm"), "-o", str(art), "--overwrite",
                          "--format", "nvfp4", "--kv-cache", "fp8", "--layout", "trtllm", "--tp", "2",
                          "--target", "sm_90a,sm_100a", "--eval", "--eval-max-tokens", "4096",
                          "--max-kl", "0.05", "--min-top1", "0.9", "--max-ppl-increase", "0.02", "--report", "-q"])
        if code:
            return code
        shot = chromium.screenshot(art / "tfcompile" / "report.html", args.out, 1200, args.height)
        if shot.console:
            print("\n".join(shot.console), file=sys.stderr)
            return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
