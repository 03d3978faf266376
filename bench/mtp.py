"""MTP-head acceptance after quantization, on the tiny oracle models of tests/fixtures/families.py.

Families (--family): deepseek_v3 (`make_mtp_oracle`), deepseek_v32 / glm_moe_dsa (DeepSeek-V3.2 /
GLM-5, the DSA indexer in the MTP layer: `make_dsa_mtp_oracle`) and qwen3_5 (the `mtp.` layout:
`make_qwen3_5_mtp_oracle`). Each model is tiny and random (one decoder layer, hidden 64,
vocabulary 256) with a constructed MTP layer (the target's own layer, shifted one position), so
the figures show what `tfcompile eval ART --reference SRC --draft mtp` reports and how each format
moves it, not what a real MTP head does. Formats: fp8-dynamic, nvfp4a16 (weight-only) and nvfp4
(W4A4, calibrated on python-doc). Each run: `--draft-k 1,2,3`, python-doc held-out prompts.

    python bench/mtp.py [--family deepseek_v3] [--work DIR] [--prompts 8] [--set PASS.FIELD=VALUE ...] [--write-docs]

`--set` adds settings to the nvfp4 (W4A4) quantize, e.g. `quantize.scale_search=none` for max-based
scales (the default searches them by output error, the MTP layer's included).

writes the family's "## Tiny ...: MTP-head acceptance after quantization" section of docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, machine_line, replace_doc_section  # noqa: E402

ACCURACY = REPO / "docs" / "accuracy.md"
# family -> (name in the heading, the fixture that builds its oracle, what the model is)
FAMILIES = {
    "deepseek_v3": ("DeepSeek-V3", "make_mtp_oracle", "DeepSeek-V3 (one MoE decoder layer)"),
    "deepseek_v32": ("DeepSeek-V3.2", "make_dsa_mtp_oracle",
                     "DeepSeek-V3.2 (one MoE decoder layer with the DSA indexer, index_topk 8)"),
    "glm_moe_dsa": ("GLM-5", "make_dsa_mtp_oracle", "GLM-5 (one MoE decoder layer with the DSA indexer, index_topk 8)"),
    "qwen3_5": ("Qwen3.5", "make_qwen3_5_mtp_oracle",
                "Qwen3.5 (one gated full-attention decoder layer, the `mtp.` layout)"),
}


def heading(family: str) -> str:
    return f"## Tiny {FAMILIES[family][0]}: MTP-head acceptance after quantization"
FORMATS = {"fp8-dynamic": [], "nvfp4a16": [],
           "nvfp4": ["--calib", "python-doc", "--calib-samples", "8", "--calib-seq-len", "64"]}


def _tfcompile(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfcompile.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO)


def _oracle(work: Path, family: str) -> Path:
    spec = importlib.util.spec_from_file_location("families", REPO / "tests" / "fixtures" / "families.py")
    fam = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fam)
    src = work / "oracle"
    if (src / "config.json").exists():
        return src
    build = getattr(fam, FAMILIES[family][1])
    return build(src, glm=True) if family == "glm_moe_dsa" else build(src)


def measure(work: Path, family: str, prompts: int, new_tokens: int, sets: list[str] = ()) -> list[dict]:
    src, rows = _oracle(work, family), []
    for fmt, extra in FORMATS.items():
        extra = extra + [a for s in sets for a in ("--set", s)] if fmt == "nvfp4" else extra
        art = work / fmt
        if not art.exists():
            q = _tfcompile("quantize", src, "-o", art, "--format", fmt, "-q", *extra)
            if q.returncode:
                raise SystemExit(f"quantize {fmt}: {q.stderr[-2000:]}")
        r = _tfcompile("eval", art, "--reference", src, "--max-tokens", "512", "--no-layers", "--draft", "mtp",
                       "--draft-k", "1,2,3", "--draft-prompts", str(prompts), "--draft-prompt-len", "32",
                       "--draft-new-tokens", str(new_tokens), "--json", "-q")
        if r.returncode:
            raise SystemExit(f"eval {fmt}: {r.stderr[-2000:]}")
        rows.append({"format": fmt, "draft": json.loads(r.stdout)["draft"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def render(rows: list[dict], family: str, prompts: int, new_tokens: int) -> str:
    lines = ["| format | k | source (bf16) | artifact | drop | artifact per position | n-gram floor |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        rep = row["draft"]
        floor = {r["k"]: r["acceptance_length"] for r in rep["ngram_floor"]}
        for r in rep["by_k"]:
            pos = " ".join(f"{p:.2f}" for p in r["per_position"] if p is not None)
            lines.append(f"| {row['format']} | {r['k']} | {r['source_acceptance_length']:.3f} | "
                         f"{r['acceptance_length']:.3f} | {r['acceptance_drop']:+.3f} | {pos} | {floor[r['k']]:.3f} |")
    return (f"Command: `python bench/mtp.py --family {family} --prompts {prompts} --write-docs`. Model: the tiny "
            f"random {FAMILIES[family][2]} of `tests/fixtures/families.py` `{FAMILIES[family][1]}` (hidden 64, "
            "vocabulary 256) whose MTP layer is constructed as the target's own layer shifted one position, so it predicts the "
            "target well; figures of a tiny random model, not of a real MTP head. Each row: `tfcompile eval ART "
            f"--reference SRC --draft mtp --draft-k 1,2,3`, {prompts} python-doc held-out prompts of 32 tokens, "
            f"{new_tokens} tokens decoded greedily each; source = the bf16 checkpoint's MTP layer against the "
            "bf16 checkpoint, artifact = the artifact's MTP layer against the artifact as served; acceptance "
            "length = tokens per target forward. Machine: " + machine_line() + ".\n\n" + "\n".join(lines)
            + "\n\n" + READING)


READING = ("Reading: drop = source minus artifact. It mixes two effects: the MTP layer's own quantization, "
           "and the target's (a quantized target decodes other tokens, which its MTP head may find easier or "
           "harder to predict; on this tiny model that is the likely source of a negative drop). tests/draft/test_draft_mtp.py separates "
           "them for fp8: against the fp8 target, the fp8 MTP layer is accepted at least as often as the bf16 "
           "source's MTP layer would be. The modelled speedup is below 1 here: this MTP layer costs as much as "
           "the one-layer target it drafts for (DeepSeek-V3's is one layer beside 61).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="deepseek_v3")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="PASS.FIELD=VALUE",
                    help="a setting of the nvfp4 quantize (repeatable)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.sets and args.write_docs:
        ap.error("--write-docs records the defaults; run --set variants without it")
    work = args.work or Path(tempfile.mkdtemp(prefix="tfc-mtp-"))
    work.mkdir(parents=True, exist_ok=True)
    body = render(measure(work, args.family, args.prompts, args.new_tokens, args.sets), args.family, args.prompts,
                  args.new_tokens)
    print(body)
    if args.write_docs:
        replace_doc_section(heading(args.family), body, ACCURACY)


if __name__ == "__main__":
    main()
