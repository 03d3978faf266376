"""Bench: what `tfcompile eval`'s per-layer figures cost against a plain eval (issue 31, section 4).

One artifact and its reference are loaded once; then the evaluation loop (tfcompile.evaluate.runner's
`_run`: both models over the same token rows; load and tokenization not counted) runs in three modes,
interleaved, `--repeat` times each; medians:

- plain: perplexity, KL and top-1 only (no per-layer hooks; `evaluate(..., layers=False)`);
- layers: plus each quantized Linear's output SQNR, isolated and end to end (the default eval);
- layers + KL: plus the KL per decoder layer through the logit lens (`eval --layer-kl`, what
  `quantize --eval --report` stores).

The per-layer figures come from the one pass: hooks capture each Linear's input and output as the
models run. The isolated SQNR adds one matmul per quantized Linear on the reference's input, on at
most 1,024 positions (SQNR_MAX_POSITIONS), and its activation emulation once per input (q/k/v and
gate/up share one); the lens adds a norm + two lm_head projections per decoder layer but the last
(whose figure comes from the logits the eval computed), on positions spread over the evaluation, as
many as keep that work within 0.3 of a plain eval's (128 to 512; evaluate/lens.py). Target (issue 31: "per-layer figures cost at most 1.5x a
plain eval"): layers + KL at most 1.5x plain. The section also gives the matmul work ratio:
(a plain eval's multiply-adds + those the per-layer figures add) / a plain eval's, counting both
models' Linears and lm_heads (attention scores, softmaxes and the activation emulation left out):
what the figures cost where matmuls dominate, whatever the implementation.

Wall and CPU time (this process's, both threads) per mode: on a shared machine CPU time is the
steadier of the two.

    python bench/eval_layers.py [--model smollm2|demo] [--format nvfp4] [--tokens 4096] [--repeat 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_busy, git_revision, machine_line, median, replace_doc_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/tfc-bench-eval-layers")
HEADING = "## Eval: per-layer figures vs a plain eval"  # + " (MODEL)": one section per --model
MODES = ("plain", "layers", "layers + KL")
TARGET = 1.5


def source(name: str) -> Path:
    if name == "demo":
        return REPO / "examples" / "demo-lm"
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint  # built once into $TFCOMPILE_CACHE/models

    return smollm2_checkpoint()


def artifact(src: Path, fmt: str) -> Path:
    out = WORK / f"{src.name}-{fmt}"
    if not (out / "tfcompile" / "manifest.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["tfcompile", "quantize", str(src), "-o", str(out), "--format", fmt, "-q"], check=True)
    return out


def time_modes(art: Path, src: Path, tokens: int, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    import torch

    from tfcompile.evaluate import runner
    from tfcompile.evaluate.lens import LayerKL
    from tfcompile.evaluate.models import load_candidate, load_checkpoint_model
    from tfcompile.evaluate.text import batches, load_text, load_tokenizer, token_rows

    ref = load_checkpoint_model(src, torch.float32, "reference")
    cand = load_candidate(art, torch.float32)
    rows = token_rows(load_text(None).text, load_tokenizer(src), max_tokens=tokens, seq_len=256,
                      vocab=int(ref.get_output_embeddings().weight.shape[0]))
    work = batches(rows, 4)
    out: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}  # this process's CPU seconds (all threads)
    out["floor"] = [matmul_floor(ref, sum(r.numel() for r in rows))]
    for _ in range(repeat):
        for mode in MODES:  # interleaved: a load change hits every mode alike
            t0, c0 = time.perf_counter(), time.process_time()
            runner._run(cand, ref, work, None, LayerKL() if mode == "layers + KL" else None,
                        per_layer=mode != "plain")
            out[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
    return out, cpu


def matmul_floor(ref, tokens: int) -> float:
    """(plain + per-layer figures) / plain, in Linear and lm_head multiply-adds per evaluated token."""
    from tfcompile.evaluate.kvtext import SQNR_MAX_POSITIONS
    from tfcompile.evaluate.lens import decoder_parts, lens_positions, matmul_work

    plain, per_position = matmul_work(ref)  # candidate and reference forwards; the lens's per position
    lens = per_position * lens_positions(tokens, plain, per_position) / tokens
    head = decoder_parts(ref)[2].weight.numel()
    iso = (plain / 2 - head) * min(tokens, SQNR_MAX_POSITIONS) / tokens  # the decoder's Linears, once
    return (plain + iso + lens) / plain


def lens_count(src: Path, tokens: int) -> int:
    """How many positions `eval --layer-kl`'s lens covers in this evaluation."""
    import torch

    from tfcompile.evaluate.lens import lens_positions, matmul_work
    from tfcompile.evaluate.models import load_checkpoint_model

    return lens_positions(tokens, *matmul_work(load_checkpoint_model(src, torch.float32, "reference")))


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())  # 1, 5, 15 minutes


def section(model: str, art: Path, tokens: int, times: dict[str, list[float]], cpu: dict[str, list[float]],
            busy: float, lens: int) -> str:
    floor = times.pop("floor")[0]
    base, cbase = median(times["plain"]), median(cpu["plain"])
    rows = "\n".join(f"| {m} | {median(t):.2f} s | {median(t) / base:.2f}x | {median(cpu[m]):.2f} s | "
                     f"{median(cpu[m]) / cbase:.2f}x | {', '.join(f'{x:.2f}' for x in t)} |" for m, t in times.items())
    full, cfull = median(times["layers + KL"]) / base, median(cpu["layers + KL"]) / cbase
    ok = "met" if max(full, cfull) <= TARGET else "NOT met"
    return (f"Command: `python bench/eval_layers.py --model {model} --tokens {tokens} --repeat "
            f"{len(times['plain'])} --write-docs`\n\n"
            f"Machine: {machine_line()}. Code: `{git_revision()}`. Load: other processes used "
            f"{busy:.1f} cores just before the runs, load average {_load()} at the end (the ratios are measured "
            "in the same run, interleaved).\n\n"
            f"Artifact `{art.name}` against its source, {tokens} held-out tokens (python-doc) in rows of 256, "
            f"batches of 4, float32; the evaluation loop only (models loaded once); the lens on {lens} of the "
            f"{tokens} positions. CPU: this process's CPU seconds (both threads), steadier than wall time "
            "on a shared machine.\n\n"
            "| eval | wall (median) | vs plain | CPU (median) | vs plain | wall runs |\n|---|---:|---:|---:|---:|---|\n"
            + rows +
            f"\n\nAll per-layer figures together (`quantize --eval --report`, `eval --layer-kl`) cost **{full:.2f}x** "
            f"a plain eval in wall time, **{cfull:.2f}x** in CPU time (target <= {TARGET}x: {ok}). Matmul work of all "
            f"the figures on these positions: {floor:.2f}x a plain eval's (the isolated SQNR's matmul per quantized "
            "Linear on its positions, the lens's two lm_head projections per decoder layer but the last on its).\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", choices=("smollm2", "demo"), default="smollm2")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    src = source(args.model)
    art = artifact(src, args.format)
    busy = cpu_busy()
    times, cpu = time_modes(art, src, args.tokens, args.repeat)
    text = section(args.model, art, args.tokens, times, cpu, busy, lens_count(src, args.tokens))
    print(text)
    if args.write_docs:
        replace_doc_section(f"{HEADING} ({args.model})", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
