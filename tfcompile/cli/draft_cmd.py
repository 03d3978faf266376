"""`tfcompile draft MODEL -o OUT`: an EAGLE-3 speculative draft trained against the target as served."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tfcompile.cli.model_ref import resolve_params
from tfcompile.cli.output import RichReporter, emit_json, rank_output


def _ints(value: str | None) -> tuple[int, ...]:
    if not value:
        return ()
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None


@click.command("draft")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Directory to write (speculators format: config.json, model.safetensors).")
@click.option("--target-artifact", type=click.Path(path_type=Path),
              help="Train against this tfcompile artifact as the engine serves it (dequantized weights, "
              "activation quantization emulated) instead of MODEL itself.")
@click.option("--revision", metavar="REV", help="Branch, tag or commit of a Hub MODEL.")
@click.option("--method", type=click.Choice(["eagle3"]), default="eagle3", show_default=True)
@click.option("--steps", type=int, default=200, show_default=True, help="Optimizer steps.")
@click.option("--batch", type=int, default=4, show_default=True,
              help="Sequences per step (under torchrun a multiple of the number of processes).")
@click.option("--batch-parts", type=int, default=0, metavar="P",
              help="Compute each step's batch in P equal parts (one forward and backward each; under torchrun "
              "each process computes P/N of them) [default: the number of processes]. One process with "
              "--batch-parts 2 writes the bytes of a 2-process torchrun run.")
@click.option("--seq-len", type=int, default=128, show_default=True, help="Tokens per training sequence.")
@click.option("--data", default="python-doc", show_default=True,
              help="Training text: python-doc (its train split), a UTF-8 file, a saved or cached data set.")
@click.option("--text-blocks", type=int, default=256, show_default=True, help="Sequences of training text.")
@click.option("--self-blocks", type=int, default=64, show_default=True,
              help="Sequences the target generates itself (greedy continuations of text prompts).")
@click.option("--self-prompt", type=int, default=32, show_default=True, help="Prompt tokens of those.")
@click.option("--ttt-steps", type=int, default=3, show_default=True, help="Chain steps trained (training-time test).")
@click.option("--draft-vocab", type=int, default=0, help="Draft vocabulary size (most frequent target ids) "
              "[default: the target's, at most 32000].")
@click.option("--aux-layers", metavar="A,B,C", help="Target hidden_states fused [default: 2, L/2, L-3].")
@click.option("--init", type=click.Choice(["target", "random"]), default="target", show_default=True,
              help="target: fc passes the highest fused state through and the decoder layer starts as the "
              "target's layer that reads it; random: seeded random weights.")
@click.option("--init-from", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Continue training this draft (a `tfcompile draft` output for the same target): its weights "
              "and draft vocabulary; --init and --draft-vocab are then ignored.")
@click.option("--cache", "cache_place", type=click.Choice(["memory", "disk"]), default="memory", show_default=True,
              help="Where the target's cached hidden states are kept (4 x hidden_size values per training "
              "token): memory, or disk (files in --resume-dir, read back per step; a resumed run reuses them).")
@click.option("--cache-dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Values of the target cache: bfloat16 halves it (hidden states rounded as a bf16 engine "
              "hands them to the draft).")
@click.option("--compute-dtype", type=click.Choice(["float32", "bfloat16", "auto"]), default="float32",
              show_default=True, help="What the target's forwards (its cache, its self-generated text) compute "
              "in: float32 as `tfcompile eval` serves it, bfloat16, or auto (bf16 where the CPU computes it "
              "natively and MODEL is bf16; docs/accuracy.md).")
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume-dir", type=click.Path(path_type=Path), help="Checkpoints and metrics; rerun to resume.")
@click.option("--checkpoint-every", type=int, default=50, show_default=True, help="Steps between checkpoints.")
@click.option("--metrics", type=click.Path(path_type=Path), help="JSON lines per logged step.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N")
@click.option("--overwrite", is_flag=True, help="Replace an existing OUT.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def draft_cmd(model, out, target_artifact, revision, method, steps, batch, batch_parts, seq_len, data, text_blocks, self_blocks,
              self_prompt, ttt_steps, draft_vocab, aux_layers, init, init_from, cache_place, cache_dtype, compute_dtype, lr, seed, resume_dir, checkpoint_every, metrics, device, overwrite,
              as_json, quiet):
    """Train an EAGLE-3 draft for MODEL (or for --target-artifact as served) and write OUT."""
    # lazy: the draft model and its training import torch and transformers; --help and usage errors must not
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import run_draft

    paths = {"model": model, "quiet": quiet}
    resolve_params(paths, ("model",), revision)
    cfg = DraftConfig(method=method, steps=steps, batch=batch, batch_parts=batch_parts, seq_len=seq_len, data=data, text_blocks=text_blocks,
                      self_blocks=self_blocks, self_prompt=self_prompt, ttt_steps=ttt_steps,
                      draft_vocab=draft_vocab, aux_layers=_ints(aux_layers), init=init, init_from=str(init_from or ""), lr=lr, seed=seed,
                      cache=cache_place, cache_dtype=cache_dtype, compute_dtype=compute_dtype,
                      resume_dir=str(resume_dir or ""), checkpoint_every=checkpoint_every, metrics=str(metrics or ""), device=device)
    console, quiet, as_json = rank_output(quiet, as_json)
    reporter = RichReporter(console, quiet=quiet)
    try:
        doc = run_draft(paths["model"], out, cfg, target_artifact=target_artifact, overwrite=overwrite,
                        reporter=reporter)
    except KeyboardInterrupt:
        if resume_dir:
            sys.stderr.write(f"checkpoint kept in {resume_dir}; rerun the same command to resume\n")
        raise
    finally:
        reporter._stop()
    if as_json:
        emit_json({"ok": True, **doc})
    elif not quiet:
        f = doc["training"]["final"]
        console.print(f"wrote {out}: EAGLE-3 draft of {doc['draft']['parameters']:,} parameters "
                      f"({doc['draft']['trained_parameters']:,} trained), {doc['data']['tokens']:,} training "
                      f"tokens, final loss {f.get('loss')}, step-0 agreement {f.get('acc_0')}, "
                      f"{doc['timings']['train_s']} s training")
