"""SmolLM2-135M: speculative acceptance of EAGLE-3 drafts trained against bf16 vs the served NVFP4 artifact.

Targets: the bf16 checkpoint (tfcompile.fixtures.smollm2) and its `tfcompile quantize --format
nvfp4` (W4A4) and `nvfp4a16` artifacts, served as `tfcompile eval` serves them (dequantized
weights, activations fake-quantized). Drafts: `tfcompile draft SMOL` (trained against bf16) and
`tfcompile draft SMOL --target-artifact NVFP4` (trained against the artifact as served), same
budget (TRAIN below) and data (python-doc's train split + the target's own greedy
continuations). Acceptance: tfcompile.draft.acceptance.measure on python-doc held-out prompts
(never trained on), greedy, at k = 2, 4, 6, for

  (a) the n-gram (prompt lookup) drafter;  (b) bf16-trained draft served against bf16;
  (c) bf16-trained draft against the nvfp4 / nvfp4a16 artifacts;  (d) nvfp4-trained against nvfp4.

Every speculative output is checked token for token against the target's greedy decoding.

    python bench/draft.py [--work DIR] [--steps N] [--lr LR] [--threads 1] [--prompts N] [--write-docs]
    python bench/draft.py --ngram-only --only nvfp4 --prompts 4 --new-tokens 48   # exactness, no drafts

writes the "## SmolLM2: speculative drafts (EAGLE-3)" section of docs/accuracy.md with --write-docs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, machine_line, replace_doc_section  # noqa: E402

ACCURACY = REPO / "docs" / "accuracy.md"
HEADING = "## SmolLM2: speculative drafts (EAGLE-3)"
KS = (2, 4, 6)
CALIB = ["--calib", "python-doc", "--calib-samples", "16", "--calib-seq-len", "512"]


# This reading (2026-12-06, draft-all: 2,555,904 training tokens, 16 prompts x 64 tokens): rewrite when the figures change.
FINDINGS = (
    "Reading: the draft now **beats the n-gram floor clearly at every k**. Against bf16, (b) gives 2.265 / 2.848 / "
    "3.018 tokens per target forward at k = 2 / 4 / 6 against prompt lookup's 2.000 / 2.400 / 2.605: +0.265 / "
    "+0.448 / +0.413, that is 4.5 / 3.8 / 2.5 standard errors of the difference (taken as independent rows; "
    "both rows decode the same prompts, so this is conservative). Served against the nvfp4a16 artifact, the same "
    "bf16-trained draft (c) gives 2.109 / 2.605 / 2.724 against prompt lookup's 1.909 / 2.307 / 2.533 there "
    "(+0.200 / +0.298 / +0.192; 3.4 / 2.6 / 1.2 standard errors) and against the nvfp4 (W4A4) artifact 2.196 / "
    "2.646 / 2.800 against 1.946 / 2.270 / 2.400 (+0.250 / +0.375 / +0.400; 4.3 / 3.4 / 2.8). What moved it is data, as the last round "
    "predicted. draft-all is trained from the target's layer on all of python-doc's train split: 8,192 text "
    "sequences and 11,776 sequences the target continued itself from 64-token train-split prompts (the held-out "
    "prompts' shape), 2,555,904 tokens, 3.25x draft-big's 786,432 and 5.75x its self-generated tokens (753,664 "
    "against 131,072); two epochs, batch 8, lr 2e-3, the same 4,096-id draft vocabulary and 3 chain steps. "
    "Across the three drafts trained from the target on this corpus, acceptance at k = 4 against bf16 went "
    "1.756 (212,992 tokens, first 8 prompts) -> 2.344 (786,432) -> 2.848 (2,555,904), prompt lookup 2.400. The "
    "first draft token is accepted at 0.70 (prompt lookup 0.48, draft-big 0.60); given the position before it, "
    "position 2 is accepted at 0.75 (prompt lookup 0.80, draft-big 0.61), 3 at 0.74 (0.77, 0.70), 4 at 0.71 "
    "(0.87, 0.58): the chain still trails prompt lookup's exact copies position for position, and the first "
    "position's lead carries the total. What made the data affordable is `--compute-dtype bfloat16` (new): "
    "the target's forwards (its cache, its 11,776 continuations) in bf16, 3.8x faster than float32 on this "
    "AVX512-BF16 CPU, so 3.25x the tokens took the wall time draft-big took (4,617 s against 4,542 s); the draft "
    "is trained against the bf16-computed target and measured against the float32 one `tfcompile eval` serves, "
    "so the figures include that mismatch. Every speculative output in this table equals the target's own "
    "greedy decoding token for token (exact = True). The previous round's notes stand: 87.9% of the tokens the "
    "target generates on these prompts occur earlier in the same sequence (bench/studies/draft_probe.py), which "
    "is why prompt lookup is a strong floor on this corpus; and the draft vocabulary was not the bound for "
    "draft-big (bench/studies/draft_widen_vocab.py: widening its 4,096 ids to 16,384 or 49,152 without "
    "training gave +0.02 at every k while the draft's cost rose from 0.06 to 0.10 and 0.20 of the target's).")

# (d) against (c) at draft-all's scale, both drafts continued alike (2026-12-06)
MATCHED = (
    "**(d) against (c) at draft-all's scale** (2026-12-06): continuations of draft-all that differ only in the "
    "target they were trained against, each 192 steps with 5 chain steps on 512 sequences that target continued "
    "itself (`--init-from draft-all --text-blocks 0 --self-blocks 512 --self-prompt 64 --ttt-steps 5 --steps 192 "
    "--batch 8 --lr 5e-4 --seq-len 128 --compute-dtype bfloat16 --cache-dtype bfloat16`; (c): the bf16 "
    "checkpoint, 283 s; (d): `--target-artifact` the nvfp4a16 artifact, 282 s, or the nvfp4 (W4A4) artifact, "
    "362 s, self-generation included), each pair served against its artifact on the same 16 held-out prompts "
    "(`python bench/draft.py --drafts bf16 nvfp4 --bf16-draft DRAFT_C --nvfp4-draft DRAFT_D4 --nvfp4a16-draft "
    "DRAFT_D --prompts 16 --only nvfp4a16 (or nvfp4) --cases c d --threads 2`, alone on the machine). On "
    "nvfp4a16: (c) 2.083 / 2.533 / 2.724, (d) 2.109 / 2.571 / 2.747 at k = 2 / 4 / 6, (d) - (c) = +0.026 (s.e. "
    "0.056) / +0.039 (0.108) / +0.022 (0.141). On nvfp4: (c) 2.145 / 2.653 / 2.848, (d) 2.145 / 2.611 / 2.762, "
    "(d) - (c) = +0.000 (0.057) / -0.041 (0.116) / -0.086 (0.155). All four drafts are exact. At this scale the "
    "target a draft was trained against makes no measurable difference: both differences lie within one "
    "standard error, in opposite directions; at draft-big's scale (on nvfp4a16: +0.056 (0.052) / +0.097 (0.091) "
    "/ +0.102 (0.103)) and for the 2026-12-04 drafts (on nvfp4: +0.055 (0.039) / +0.044 (0.046) / +0.044 "
    "(0.046)) (d) was ahead. Pooled by inverse variance over the four independent comparisons, (d) - (c) = "
    "+0.039 (s.e. 0.025) / +0.044 (0.036) / +0.042 (0.039), 1.6 / 1.2 / 1.1 standard errors. The hypothesis "
    "(d) beats (c) is not confirmed: a small gain (about +0.05 tokens per target forward) for weak drafts, none "
    "measurable for the strong one, against +0.50 at k = 4 from more data (draft-big to draft-all). Continuing "
    "draft-all against bf16 did not help it either (on nvfp4a16 2.083 / 2.533 / 2.724 against draft-all's own "
    "2.109 / 2.605 / 2.724; on nvfp4 2.145 / 2.653 / 2.848 against 2.196 / 2.646 / 2.800).")

# vLLM's CPU build serving the draft (bench/draft_vllm.py, the same 16 held-out prompts, 64 tokens, k = 4)
VLLM = (
    "vLLM 0.32's CPU build serves draft-all as written (`python bench/draft_vllm.py --draft draft-all --k 4 "
    "--prompts 16`, bf16 target, the same 16 prompts, 54 s, 2026-12-06; `speculative_config={\"method\": "
    "\"eagle3\", \"model\": DRAFT, \"num_speculative_tokens\": 4}`): its own counters give 1 + accepted / "
    "drafts = 2.845 (362 drafts, 668 of 1,448 draft tokens accepted) against 2.848 from the reference decoder "
    "at k = 4 (vLLM serves the target in bf16, the reference decoder in float32). vLLM's prompt lookup "
    "(`--draft ngram`, n = 1..4, 21 s) gives 2.815 by the same formula (329 drafts, 597 of 1,304 accepted), but "
    "vLLM counts only the rounds that drafted (prompt lookup proposes nothing where no n-gram matches): of the "
    "1,024 tokens decoded, 329 + 597 = 926 came from drafting rounds, so about 98 more target forwards yielded "
    "one token each, and tokens per target forward are about 1,024 / 427 = 2.40, the reference decoder's 2.400; "
    "the EAGLE-3 draft always drafts, so its 2.845 is already that figure. In the engine as in the reference "
    "decoder: draft-all about 2.85, prompt lookup about 2.40. draft-big (the previous round) gave 2.306 there "
    "against 2.344 from the reference decoder.")

# How this reading's figures were produced (rewrite with FINDINGS)
MEASURED = ("`--drafts bf16 --bf16-draft draft-all --prompts 16` with `--only bf16` (cases a, b), `--only nvfp4 "
            "--cases a c` and `--only nvfp4a16 --cases a c`, 2026-12-06, one process at a time on the otherwise idle machine, 2 torch threads")
TRAINED = ("`draft-all` is `tfcompile draft SMOL -o draft-all --text-blocks 8192 --self-blocks 11776 --self-prompt 64 "
           "--seq-len 128 --batch 8 --steps 4096 --lr 2e-3 --draft-vocab 4096 --compute-dtype bfloat16 --cache-dtype "
           "bfloat16 --resume-dir R --checkpoint-every 200` (3 chain steps), two torch threads, alone on the machine "
           "but for about two minutes of tests and a niced pip install during the self-generation (load not taken): "
           "4,617 s of wall time, of which 1,381 s loading the target and generating the 11,776 continuations (about "
           "7 s per 64), about 745 s the target cache (2,555,904 tokens) and 2,490 s the 4,096 steps (0.61 s each); "
           "peak RSS 12.5 GiB (the cache in memory: 4 H bf16 values per token, 4.6 KB, 11.8 GB in all; `--cache "
           "disk` keeps it in the resume folder instead). draft-big, the previous round's draft (786,432 tokens, "
           "float32 forwards and cache), took 4,542 s and 8.6 GiB.")
DRAFT_VOCAB = 2048  # EAGLE-3-style reduced vocabulary: the head costs H x 2048 instead of H x 49152


BATCH, SEQ_LEN = 4, 128


def train_args(steps: int, lr: str, text: int, self_: int) -> list[str]:
    return ["--steps", str(steps), "--batch", str(BATCH), "--seq-len", str(SEQ_LEN), "--text-blocks", str(text),
            "--self-blocks", str(self_), "--self-prompt", "32", "--draft-vocab", str(DRAFT_VOCAB), "--lr", lr]


def draft_name(name: str, args) -> str:
    """The cached draft's directory name under --work: what it was trained with."""
    return f"{name}-{args.steps}-t{args.text_blocks}-s{args.self_blocks}-v{DRAFT_VOCAB}-lr{args.lr}"


def child_env(threads: int) -> dict:
    """The environment of the `tfcompile` children: `threads` torch threads (OMP_NUM_THREADS). On
    the shared 2-core machine under load two threads per process are slower than one (their
    OpenMP barriers wait on descheduled threads; 2026-12-04, load average 8: a [16, 32, 576]
    float32 multiply took 31.6 ms at 2 threads, 2.0 ms at 1), and the two drafts train at once."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


def tfcompile(*args, threads: int = 1) -> tuple[dict, float]:
    exe = Path(sys.executable).with_name("tfcompile")
    t0 = time.perf_counter()
    res = subprocess.run([str(exe), *map(str, args), "--json", "-q"], capture_output=True, text=True,
                         env=child_env(threads))
    if res.returncode != 0:
        sys.exit(f"tfcompile {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout), time.perf_counter() - t0


def load(): return os.getloadavg()[0]


def build_targets(work: Path, smol: Path) -> None:
    for fmt in ("nvfp4", "nvfp4a16"):
        if not (work / f"smol-{fmt}").exists():
            tfcompile("quantize", "--format", fmt, smol, "-o", work / f"smol-{fmt}", *(CALIB if fmt == "nvfp4" else []))


def build(work: Path, smol: Path, args) -> dict:
    """Artifacts and drafts (kept in work/ between runs); the two drafts train concurrently."""
    build_targets(work, smol)
    exe = Path(sys.executable).with_name("tfcompile")
    jobs = {}
    # --bf16-draft / --nvfp4-draft: a draft trained elsewhere (e.g. continued with --init-from) is measured as is
    given = {f"draft-{k}": Path(v) for k, v in (("bf16", args.bf16_draft), ("nvfp4", args.nvfp4_draft),
                                                 ("nvfp4a16", args.nvfp4a16_draft)) if v}
    for name, extra in (("draft-bf16", []), ("draft-nvfp4", ["--target-artifact", work / "smol-nvfp4"])):
        if name.removeprefix("draft-") not in args.drafts or name in given:
            continue
        out = work / draft_name(name, args)
        if not (work / f"{out.name}.cli.json").exists():
            argv = [str(exe), "draft", smol, "-o", out, *train_args(args.steps, args.lr, args.text_blocks, args.self_blocks), *extra, "--json", "-q", "--overwrite"]
            fh = open(work / f"{out.name}.cli.json.tmp", "w")
            jobs[name] = (subprocess.Popen(list(map(str, argv)), stdout=fh, env=child_env(args.threads)), fh, out,
                          time.perf_counter(), load())
    for name, (proc, fh, out, t0, l0) in jobs.items():
        if proc.wait() != 0:
            sys.exit(f"tfcompile draft ({name}) failed ({proc.returncode})")
        fh.close()
        doc = json.loads((work / f"{out.name}.cli.json.tmp").read_text())
        doc["bench"] = {"wall_s": round(time.perf_counter() - t0, 1), "load": round(l0, 1),
                        "concurrent": len(jobs)}
        (work / f"{out.name}.cli.json").write_text(json.dumps(doc))
    made = {}
    for name in [n for n in ("draft-bf16", "draft-nvfp4") if n.removeprefix("draft-") in args.drafts]:
        made[name] = trained(given.get(name, work / draft_name(name, args)))
    if "draft-nvfp4a16" in given:  # measured as given only: no training here
        made["draft-nvfp4a16"] = trained(given["draft-nvfp4a16"])
    return made


def trained(out: Path) -> dict:
    """A written draft and its training figures (OUT.cli.json beside it: the CLI's JSON + "bench")."""
    doc = json.loads(out.with_name(f"{out.name}.cli.json").read_text())
    return {"train_s": doc["timings"]["train_s"], "data_s": doc["timings"]["data_s"],
            "threads": doc["timings"]["threads"], **doc["bench"],
            "record": json.loads((out / "tfcompile" / "draft.json").read_text()), "path": out}


def measure_all(work: Path, smol: Path, drafts: dict, prompts: int, new_tokens: int,
                only: tuple[str, ...] = (), only_cases: tuple[str, ...] = ()) -> list[dict]:
    import torch

    from tfcompile.draft.acceptance import greedy_refs, measure, prompts_of
    from tfcompile.evaluate.models import load_candidate
    from tfcompile.evaluate.text import load_tokenizer

    rows = prompts_of(None, load_tokenizer(smol), count=prompts, prompt_len=64, vocab=49152)
    bf, nv = (drafts or {}).get("draft-bf16", {}).get("path"), (drafts or {}).get("draft-nvfp4", {}).get("path")
    nv16 = (drafts or {}).get("draft-nvfp4a16", {}).get("path")
    cases = [("a", "n-gram", "bf16", smol, "ngram"),
             ("b", "EAGLE-3 trained vs bf16", "bf16", smol, bf),
             ("a", "n-gram", "nvfp4", work / "smol-nvfp4", "ngram"),
             ("c", "EAGLE-3 trained vs bf16", "nvfp4", work / "smol-nvfp4", bf),
             ("d", "EAGLE-3 trained vs nvfp4 served", "nvfp4", work / "smol-nvfp4", nv),
             ("a", "n-gram", "nvfp4a16", work / "smol-nvfp4a16", "ngram"),
             ("c", "EAGLE-3 trained vs bf16", "nvfp4a16", work / "smol-nvfp4a16", bf),
             ("d", "EAGLE-3 trained vs nvfp4a16 served", "nvfp4a16", work / "smol-nvfp4a16", nv16)]
    cases = [c for c in cases if c[4] is not None]  # drafts None: the n-gram rows only (--ngram-only)
    out, models, refs = [], {}, {}
    for case, drafter, served, path, spec in cases:
        if (only and served not in only) or (only_cases and case not in only_cases):
            continue
        if served not in models:
            models.clear()
            models[served] = load_candidate(Path(path), torch.float32).model.eval()
            refs[served] = greedy_refs(models[served], rows, new_tokens)  # once per served target
        t0, l0 = time.perf_counter(), load()
        rep = measure(models[served], str(spec), rows, ks=KS, new_tokens=new_tokens, refs=refs[served])
        out.append({"case": case, "drafter": drafter, "served": served, "exact": rep["exact"], "by_k": rep["by_k"],
                    "s": round(time.perf_counter() - t0, 1), "load": round(l0, 1)})
        print(json.dumps(out[-1]), flush=True)
    return out


def std_error(fig: dict) -> float:
    """Standard error of one acceptance length (tokens per target forward, figures() of acceptance.py)
    from its per-position acceptance: a round yields L = 1 + S tokens, S = the number of leading draft
    tokens accepted, so P(S >= j) = per_position[j-1] (position j is accepted only after 1..j-1) and
    E[S^2] = sum_j (2j - 1) P(S >= j); SE = sqrt(Var(S) / rounds). Rounds are treated as independent
    (those of one prompt are not quite), so this is an approximation."""
    p = [x or 0.0 for x in fig["per_position"]]
    es, es2 = sum(p), sum((2 * j + 1) * x for j, x in enumerate(p))
    return ((es2 - es * es) / max(1, fig["target_forwards"])) ** 0.5


def comparisons(rows: list[dict]) -> list[str]:
    """(d) - (c) on nvfp4, and each draft row against the n-gram floor on its target, per k, with the
    standard error of the difference (the two rows' errors combined as independent)."""
    def by(r):
        return {x["k"]: x for x in r["by_k"]}

    def diff(a, b):
        return " / ".join(f"{by(a)[k]['acceptance_length'] - by(b)[k]['acceptance_length']:+.3f} "
                          f"(s.e. {(std_error(by(a)[k]) ** 2 + std_error(by(b)[k]) ** 2) ** 0.5:.3f})" for k in KS)

    find = {(r["case"], r["served"]): r for r in rows}
    out = []
    for served in ("nvfp4", "nvfp4a16"):
        if ("d", served) in find and ("c", served) in find:
            out.append(f"(d) minus (c) on {served} at k = {' / '.join(map(str, KS))}: "
                       f"{diff(find['d', served], find['c', served])}.")
    for r in rows:
        floor = find.get(("a", r["served"]))
        if r["case"] != "a" and floor is not None:
            out.append(f"({r['case']}) on {r['served']} minus the n-gram floor: {diff(r, floor)}.")
    return out


def flags(c: dict) -> str:
    """The `tfcompile draft` training flags of a draft's recorded config."""
    out = (f"--steps {c['steps']} --batch {c['batch']} --seq-len {c['seq_len']} --text-blocks {c['text_blocks']} "
           f"--self-blocks {c['self_blocks']} --self-prompt {c['self_prompt']} --draft-vocab {c['draft_vocab']} "
           f"--lr {c['lr']:g}")
    for key in ("ttt_steps", "compute_dtype", "cache_dtype"):  # left out where they are the defaults
        if c.get(key) not in (None, 3, "float32"):
            out += f" --{key.replace('_', '-')} {c[key]}"
    return out + (f" --init-from {Path(c['init_from']).name}" if c.get("init_from") else "")


def markdown(rows: list[dict], drafts: dict, args, prompts: int, new_tokens: int) -> str:
    drafts_arg = "" if set(args.drafts) == {"bf16", "nvfp4"} else " --drafts " + " ".join(args.drafts)
    for flag in ("bf16_draft", "nvfp4_draft", "nvfp4a16_draft"):
        if getattr(args, flag):
            drafts_arg += f" --{flag.replace('_', '-')} {getattr(args, flag).name}"
    trains = not all(getattr(args, f"{d}_draft") for d in args.drafts)  # else the training flags do nothing
    recs = [d["record"] for d in drafts.values()]  # what the measured drafts were trained with
    vocab = " / ".join(sorted({str(r["draft"]["draft_vocab"]) for r in recs})) or DRAFT_VOCAB
    ttt = " / ".join(sorted({str(r["config"]["ttt_steps"]) for r in recs})) or 3
    train = f"--steps {args.steps} --text-blocks {args.text_blocks} --self-blocks {args.self_blocks} --lr {args.lr} "
    lines = [f"Command: `nice -n 19 python bench/draft.py {train if trains else ''}{drafts_arg.strip()} --prompts {prompts} "
             "--write-docs`. Target: "
             "SmolLM2-135M-Instruct (bf16 fixture, weights carry GGUF Q4_1 rounding) and its `tfcompile quantize` "
             "nvfp4 (W4A4) / nvfp4a16 artifacts (16 x 512 calibration tokens), served as `tfcompile eval` serves "
             "them. Drafts: `tfcompile draft` with the flags of the training table below (one EAGLE-3 decoder "
             f"layer started from the target's (`--init target`), {ttt} chain steps trained, draft vocabulary {vocab} "
             f"of 49152), against bf16 or with `--target-artifact` "
             f"nvfp4. Acceptance: {prompts} prompts of 64 tokens of python-doc's held-out split (never trained on), "
             f"{new_tokens} tokens decoded greedily each; acceptance length = tokens per target forward; exact: "
             "whether every speculative output equals the target's own greedy decoding token for token. "
             f"Measured as {MEASURED} then `--render`, with --new-tokens {new_tokens}.", "",
             "| case | drafter | served target | " + " | ".join(f"k={k}" for k in KS)
             + " | accepted at positions 1..4 (k=4) | exact |",
             "|---|---|---|" + "---|" * len(KS) + "---|---|"]
    for r in rows:
        by = {x["k"]: x for x in r["by_k"]}
        pos = " ".join(f"{p:.2f}" for p in by[4]["per_position"])
        lines.append(f"| ({r['case']}) | {r['drafter']} | {r['served']} | "
                     + " | ".join(f"{by[k]['acceptance_length']:.3f} ± {std_error(by[k]):.3f}" for k in KS)
                     + f" | {pos} | {r['exact']} |")
    lines += ["", "± one standard error (`std_error` in bench/draft.py). Differences, with the standard error "
              "of the difference:", ""] + [f"- {c}" for c in comparisons(rows)]
    lines += ["", "| draft | trained against | flags | data s (incl. self-generation) | train s | tokens used | "
              "draft size (bf16) | trained parameters | threads | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in drafts.items():
        rec = d["record"]
        lines.append(f"| {name} | {rec['target']['served_as']} | `{flags(rec['config'])}` | {d['data_s']} | {d['train_s']} | "
                     f"{rec['training']['tokens_seen']:,} seen of {rec['data']['tokens']:,} | "
                     f"{rec['draft']['bytes'] / 2**20:.1f} MiB | {rec['draft']['trained_parameters']:,} | "
                     f"{d['threads']} | {d['load']} |")
    import torch

    lines += ["", FINDINGS, "", MATCHED, "", VLLM, "", f"Machine: {machine_line()}, torch.backends.cpu.get_cpu_capability() = "
              f"{torch.backends.cpu.get_cpu_capability()}; load = 1-minute load average at the start of each run "
              f"(the machine is shared; timings are wall seconds there). {TRAINED}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TFCOMPILE_CACHE", Path.home() / ".cache/tfcompile"))
                    / "bench" / "draft")
    ap.add_argument("--steps", type=int, default=320, help="optimizer steps (320 x 4 x 128: one epoch of the data)")
    ap.add_argument("--text-blocks", type=int, default=1024, help="training sequences of python-doc train text")
    ap.add_argument("--self-blocks", type=int, default=256, help="training sequences the target continues itself")
    ap.add_argument("--lr", default="3e-3")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every process (OMP_NUM_THREADS)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--drafts", nargs="+", default=("bf16", "nvfp4"), choices=("bf16", "nvfp4"),
                    help="train (or reuse) these drafts only: bf16 = cases (b), (c); nvfp4 = case (d)")
    ap.add_argument("--bf16-draft", type=Path, help="measure this draft as the bf16-trained one (cases b, c) "
                    "instead of training one; its CLI JSON must lie beside it as DIR.cli.json")
    ap.add_argument("--nvfp4-draft", type=Path, help="the same for the nvfp4-trained draft (case d)")
    ap.add_argument("--nvfp4a16-draft", type=Path, help="a draft trained against the nvfp4a16 artifact elsewhere "
                    "(case d on nvfp4a16; measured as given, never trained here)")
    ap.add_argument("--only", nargs="+", default=(), choices=("bf16", "nvfp4", "nvfp4a16"),
                    help="measure these served targets only (results-<target>.json; run several at once)")
    ap.add_argument("--cases", nargs="+", default=(), choices=("a", "b", "c", "d"),
                    help="measure these cases only (results-<target>-<cases>.json; run several at once)")
    ap.add_argument("--render", action="store_true", help="assemble the results-*.json of --only runs")
    ap.add_argument("--ngram-only", action="store_true",
                    help="no drafts: the n-gram rows only, exactness included (prints JSON lines, writes no docs)")
    args = ap.parse_args()
    import torch

    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    torch.set_num_threads(args.threads)
    smol = Path(smollm2_checkpoint())
    args.work.mkdir(parents=True, exist_ok=True)
    if args.ngram_only:
        build_targets(args.work, smol)
        measure_all(args.work, smol, None, args.prompts, args.new_tokens, tuple(args.only))
        return
    drafts = build(args.work, smol, args)
    if args.render:
        order = {"bf16": 0, "nvfp4": 1, "nvfp4a16": 2}
        rows = [r for f in sorted(args.work.glob("results-*.json")) for r in json.loads(f.read_text())]
        rows.sort(key=lambda r: (order[r["served"]], r["case"]))
    else:
        rows = measure_all(args.work, smol, drafts, args.prompts, args.new_tokens, tuple(args.only),
                           tuple(args.cases))
        name = "results-" + ("-".join(args.only) if args.only else "all") + "".join(f"-{c}" for c in args.cases) + ".json"
        (args.work / name).write_text(json.dumps(rows, indent=1))
    md = markdown(rows, drafts, args, args.prompts, args.new_tokens)
    print(md)
    if args.write_docs:
        replace_doc_section(HEADING, md, ACCURACY)


if __name__ == "__main__":
    main()
