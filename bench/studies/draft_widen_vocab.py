"""Does the draft vocabulary bound an EAGLE-3 draft's acceptance? Widen a trained draft and measure.

A `tfcompile draft` draft scores its draft vocabulary (the Vd most frequent ids of its training
tokens) with the target's own lm_head rows, frozen (tfcompile/draft/run.py `build_draft`), so a
wider vocabulary needs no training: the trained fc, decoder layer and norm are kept, the lm_head
gets the target's rows of the wider id set (the same frequency rule, so a superset of the old one)
and d2t / t2d follow; Vd = the target's vocabulary drops d2t / t2d (speculators' full-vocabulary
form). The training tokens are rebuilt from the draft's resume folder (run.json's config, the
self-generated chunks it holds: no generation), and the rebuilt Vd-id set is checked against the
draft's own before anything is written.

    python -m bench.studies.draft_widen_vocab --draft DIR --resume-dir R --sizes 16384 49152 --out WORK

writes WORK/NAME-vN per size (with DIR.cli.json copied beside it, as bench/draft.py's
--bf16-draft wants) and prints the bench/draft.py command that measures each (case b, bf16).
Measured 2026-12-06 on draft-big: docs/accuracy.md "SmolLM2: speculative drafts (EAGLE-3)".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import types
from pathlib import Path


def training_ids(resume: Path, smol: Path, target):
    """draft's training tokens, int64 [N, T], rebuilt from its resume folder (tfcompile.draft.train)."""
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.train import training_tokens
    from tfcompile.evaluate.text import load_tokenizer

    cfg = DraftConfig(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in json.loads((resume / "run.json").read_text())["config"].items()})
    tokens, _ = training_tokens(cfg, load_tokenizer(smol), target, resume=types.SimpleNamespace(path=resume))
    return tokens


def widened(draft, head, tokens, size: int):
    """A copy of `draft` whose vocabulary is the `size` most frequent ids of `tokens` (build_draft's rule)."""
    from tfcompile.draft.eagle3 import Eagle3Draft
    from tfcompile.draft.run import set_vocabulary

    new = Eagle3Draft(dataclasses.replace(draft.s, draft_vocab=size))
    trained = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, extra = new.load_state_dict(trained, strict=False)
    assert not extra and set(missing) <= {"lm_head.weight", "d2t", "t2d"}, (missing, extra)
    set_vocabulary(new, head, tokens)
    return new


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", type=Path, required=True, help="a draft written by `tfcompile draft`")
    ap.add_argument("--resume-dir", type=Path, required=True, help="its --resume-dir (run.json, selfgen chunks)")
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from tfcompile.draft.format import load_draft, write_draft
    from tfcompile.draft.train import draft_vocab
    from tfcompile.evaluate.models import load_checkpoint_model
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    smol = Path(smollm2_checkpoint())
    target = load_checkpoint_model(smol, torch.float32, "reference").eval()
    tokens = training_ids(args.resume_dir, smol, target)
    draft = load_draft(args.draft)
    if draft.d2t is None or not torch.equal(draft_vocab(tokens, draft.s.vocab, draft.s.draft_vocab),
                                            torch.arange(draft.s.draft_vocab) + draft.d2t):
        raise SystemExit(f"{args.resume_dir} does not rebuild {args.draft}'s vocabulary: not its resume folder")
    head = target.get_output_embeddings().weight.detach().float()
    cfg = json.loads((args.draft / "config.json").read_text())
    for size in args.sizes:
        out = args.out / f"{args.draft.name}-v{size}"
        wide = widened(draft, head, tokens, size)
        write_draft(out, wide, {**cfg, "draft_vocab_size": size})
        (out / "tfcompile").mkdir(exist_ok=True)  # the training record bench/draft.py reads
        shutil.copy(args.draft / "tfcompile" / "draft.json", out / "tfcompile" / "draft.json")
        shutil.copy(args.draft.with_name(f"{args.draft.name}.cli.json"), out.with_name(f"{out.name}.cli.json"))
        cover = 1.0 if wide.t2d is None else float(wide.t2d[tokens].float().mean())
        print(f"{out}: vocabulary {size}, {cover:.4f} of the training tokens inside; measure with\n"
              f"  python bench/draft.py --work W --drafts bf16 --bf16-draft {out} --prompts 16 --only bf16 --cases b")


if __name__ == "__main__":
    main()
