"""Train the demo causal LM committed under examples/demo-lm, on CPU.

    python scripts/train_demo_lm.py examples/demo-lm --overwrite --steps 1000   # the committed model
    python scripts/train_demo_lm.py OUT --minutes 25                            # cosine over 25 minutes
    python scripts/train_demo_lm.py /tmp/smoke --smoke                      # a few seconds (tests)
    python scripts/train_demo_lm.py examples/demo-gemma --family gemma3 --overwrite --steps 1000

`--family gemma3` trains the same size of model with Gemma 3's structure instead
(Gemma3ForCausalLM: (1 + w) RMSNorm, pre- and post-norms around attention and MLP,
q/k norms, GeGLU (gelu-tanh gate), tied embeddings scaled by sqrt(hidden), sliding-window
layers with every fourth global) on the same text and recipe: a second trained family
whose quantization is known to be more sensitive than Llama's (issue 33).

A small LlamaForCausalLM (hidden 256, intermediate 768, 4 layers, 4 heads of
64, 2 KV heads, vocab 4096, untied lm_head; every Linear's in_features is a
multiple of 128 so every block format divides evenly) trained from scratch on
the "train" split of the Python 3.11 documentation (Debian python3.11-doc;
see tfcompile.calibration.corpus). The tokenizer is a byte-level BPE trained
here on the same split. Held-out perplexity is measured on the "heldout"
split before and after training; the figures go to stdout (JSON), to
OUT/TRAINING.md and to OUT/training.json.

Training: fp32, seed 0, AdamW (betas 0.9/0.95, weight decay 0.1 on matrices),
linear warmup then cosine decay to 10% of the peak learning rate, gradient
clipping at 1.0, batches of 16 blocks of 256 tokens in a seeded shuffled
order. With `--steps N` the cosine runs over N steps and depends on the step
only, so a run is deterministic on a given machine and thread count; the
committed model was trained so. Without it the cosine runs over the wall time
of `--minutes` (speed on a shared machine drifts, so no step count is
guessed) and training stops when the budget is spent. `--minutes` always
stops training on time (the default budget is 25 minutes).
Weights are saved in bf16 with save_pretrained (safetensors).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3, as tests/fixtures/models.py
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)


@dataclass(frozen=True)
class Setup:
    vocab: int = 4096
    hidden: int = 256
    intermediate: int = 768
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    seq_len: int = 256
    batch: int = 16
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.1
    eval_tokens: int = 65536  # held-out tokens fed to the model (blocks of seq_len)
    family: str = "llama"  # "llama" | "gemma3" (--family)
    train_files: int | None = None  # None: the whole train split


SMOKE = Setup(vocab=512, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2, seq_len=64, batch=4,
              lr=3e-3, warmup=2, eval_tokens=1024, train_files=12)


def train_tokenizer(texts: list[str], vocab: int):
    """Byte-level BPE over `texts`, wrapped as a PreTrainedTokenizerFast that adds <s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL_TOKENS[BOS_ID]} $A", pair=f"{SPECIAL_TOKENS[BOS_ID]} $A {SPECIAL_TOKENS[BOS_ID]} $B",
        special_tokens=[(SPECIAL_TOKENS[BOS_ID], BOS_ID)])
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=SPECIAL_TOKENS[UNK_ID],
                                   bos_token=SPECIAL_TOKENS[BOS_ID], eos_token=SPECIAL_TOKENS[EOS_ID],
                                   pad_token=SPECIAL_TOKENS[PAD_ID])


def texts_sha256(texts: list[str]) -> str:
    """Fingerprint of the training text (Debian patches python3.11-doc in point releases)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()


def corpus_package() -> str | None:
    """The installed python3.11-doc version (dpkg), or None off Debian."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3.11-doc"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def build_model(s: Setup):
    for lin_in in (s.hidden, s.intermediate):
        if lin_in % 128 and s.train_files is None:  # the real model: every block format must divide
            raise SystemExit(f"error: Linear in_features {lin_in} is not a multiple of 128")
    common = dict(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                  num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                  head_dim=s.hidden // s.heads, max_position_embeddings=s.seq_len,
                  bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, initializer_range=0.02)
    if s.family == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        # Gemma 3's pattern at this depth: sliding-window layers (half the context) and every fourth
        # global; the query scale is head_dim^-1/2 as in the 1B-4B models; tied, scaled embeddings
        layer_types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(s.layers)]
        config = Gemma3TextConfig(**common, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                  query_pre_attn_scalar=s.hidden // s.heads, sliding_window=s.seq_len // 2,
                                  layer_types=layer_types)
        return Gemma3ForCausalLM(config)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**common, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0)
    return LlamaForCausalLM(config)


@torch.no_grad()
def perplexity(model, blocks: torch.Tensor, batch: int = 16) -> float:
    """Token-level perplexity: exp(mean NLL over every predicted token of every block)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch):
        x = blocks[i:i + batch]
        logits = model(input_ids=x).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                reduction="sum")
        total += nll.item()
        count += x[:, 1:].numel()
    return math.exp(total / count)


def lr_factor(step: int, warmup: int, progress: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from 1 to 0.1 as `progress` goes 0 -> 1."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?", help="directory to create, e.g. examples/demo-lm")
    parser.add_argument("--eval", type=Path, nargs="+", metavar="DIR", default=None,
                        help="only measure held-out perplexity of these checkpoints or tfcompile artifacts")
    parser.add_argument("--overwrite", action="store_true", help="replace out_dir if it exists")
    parser.add_argument("--minutes", type=float, default=25.0, help="training-loop time budget (default 25)")
    parser.add_argument("--steps", type=int, default=None, help="exact number of optimizer steps (no timing probe)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, few files, few steps (tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=("llama", "gemma3"), default="llama",
                        help="model structure (default llama: examples/demo-lm; gemma3: examples/demo-gemma)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--corpus-root", type=Path, default=None, help="python3.11-doc _sources directory")
    args = parser.parse_args(argv)

    from tfcompile.calibration.corpus import PYTHON_DOC_DIR, iter_token_blocks, python_doc_texts
    from tfcompile.errors import UserError

    s = dataclasses.replace(SMOKE if args.smoke else Setup(), family=args.family)
    if args.eval:
        torch.set_num_threads(args.threads)
        return evaluate(args.eval, s, args.corpus_root)
    if args.out_dir is None:
        parser.error("out_dir is required (or --eval DIR...)")
    steps_arg = args.steps if args.steps is not None else (6 if args.smoke else None)
    if args.out_dir.exists() and not args.overwrite:
        print(f"error: {args.out_dir} already exists\nhint: pass --overwrite to replace it", file=sys.stderr)
        return 1
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    try:
        train_texts = python_doc_texts("train", args.corpus_root)
        heldout_texts = python_doc_texts("heldout", args.corpus_root)
    except UserError as e:
        print(f"error: {e.message}\nhint: {e.hint}", file=sys.stderr)
        return 1
    if s.train_files is not None:
        train_texts = train_texts[:s.train_files]

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    tokenizer = train_tokenizer(train_texts, s.vocab)
    log(f"tokenizer: {len(tokenizer)} tokens from {len(train_texts)} files")
    train = torch.tensor(list(iter_token_blocks(tokenizer, train_texts, s.seq_len)), dtype=torch.long)
    eval_blocks = s.eval_tokens // s.seq_len
    heldout = torch.tensor(list(iter_token_blocks(tokenizer, heldout_texts, s.seq_len, eval_blocks)), dtype=torch.long)
    if len(heldout) < eval_blocks:
        raise SystemExit(f"error: held-out split gives {len(heldout)} blocks, {eval_blocks} wanted")
    log(f"train: {len(train)} blocks of {s.seq_len} ({train.numel()} tokens); heldout: {heldout.numel()} tokens")

    model = build_model(s)
    n_params = sum(p.numel() for p in model.parameters())
    ppl_before = perplexity(model, heldout)
    log(f"model: {n_params} parameters; held-out perplexity before training {ppl_before:.2f}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(train), generator=gen)
    pos = 0
    total_steps = steps_arg if steps_arg is not None else 10**9
    t_warm = None  # training-loop time when warmup ended (time-based schedule)
    budget_s = args.minutes * 60.0
    model.train()
    t_train = time.perf_counter()
    step, tokens_seen, stopped_by = 0, 0, "step count reached"
    loss_log: list[float] = []
    while step < total_steps:
        elapsed = time.perf_counter() - t_train
        if elapsed >= budget_s:
            stopped_by = "time budget"
            break
        if pos + s.batch > len(order):
            order = torch.randperm(len(train), generator=gen)
            pos = 0
        x = train[order[pos:pos + s.batch]]
        pos += s.batch
        for g in opt.param_groups:
            if steps_arg is not None:  # a fixed schedule: depends on the step only
                progress = (step - s.warmup) / max(1, steps_arg - s.warmup)
            else:  # the time budget: cosine over the wall time left after warmup
                if step == s.warmup:
                    t_warm = elapsed
                progress = 0.0 if t_warm is None else (elapsed - t_warm) / max(1e-9, budget_s - t_warm)
            g["lr"] = s.lr * lr_factor(step, s.warmup, progress)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        loss_log.append(loss.item())
        if step % 50 == 0 or step == 1:
            log(f"step {step}{f'/{steps_arg}' if steps_arg else ''} loss {sum(loss_log[-50:]) / len(loss_log[-50:]):.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e}")
    train_s = time.perf_counter() - t_train
    ppl_after_fp32 = perplexity(model, heldout)
    model = model.to(torch.bfloat16)
    ppl_after = perplexity(model.float(), heldout)  # the saved bf16 weights, computed in fp32
    log(f"trained {step} steps, {tokens_seen} tokens in {train_s:.0f} s; held-out perplexity "
        f"{ppl_before:.2f} -> {ppl_after_fp32:.2f} (fp32) / {ppl_after:.2f} (bf16 weights)")

    from transformers import GenerationConfig

    out = args.out_dir
    staging = out.with_name(out.name + ".tmp-train")
    shutil.rmtree(staging, ignore_errors=True)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                                               do_sample=False, max_length=s.seq_len)
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    portable_tokenizer_config(staging)
    figures = {
        "setup": asdict(s), "seed": args.seed, "threads": args.threads, "smoke": args.smoke,
        "corpus": str(args.corpus_root or PYTHON_DOC_DIR), "train_files": len(train_texts),
        "heldout_files": len(heldout_texts), "train_tokens": train.numel(), "parameters": n_params,
        "steps": step, "stopped_by": stopped_by, "tokens_seen": tokens_seen,
        "train_seconds": round(train_s, 1), "total_seconds": round(time.perf_counter() - t_start, 1),
        "heldout_tokens": heldout.numel(), "heldout_predicted_tokens": heldout[:, 1:].numel(),
        "ppl_before": round(ppl_before, 3), "ppl_after_fp32": round(ppl_after_fp32, 3),
        "ppl_after_bf16": round(ppl_after, 3), "final_train_loss_50": round(sum(loss_log[-50:]) / max(1, len(loss_log[-50:])), 4),
        "architecture": type(model).__name__, "torch": torch.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "train_sha256": texts_sha256(train_texts), "corpus_package": corpus_package(),
        "tokenizers": importlib.metadata.version("tokenizers"),
    }
    (staging / "training.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    (staging / "TRAINING.md").write_text(training_md(figures, args))
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    log(f"wrote {out} ({size / 1e6:.1f} MB)")
    print(json.dumps(figures, sort_keys=True))
    return 0


def portable_tokenizer_config(out: Path) -> None:
    """Name the tokenizer class PreTrainedTokenizerFast, not transformers 5's TokenizersBackend.

    transformers 5 loads either name as the same class; transformers 4 (what vLLM and SGLang
    installs often carry) knows only PreTrainedTokenizerFast.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def evaluate(dirs: list[Path], s: Setup, corpus_root: Path | None) -> int:
    """Held-out perplexity (the same tokens as training's report) of each checkpoint or artifact.

    Artifacts (config.json with a quantization_config) are loaded by transformers + compressed-tensors
    two ways: "weights" (dequantize=True, fp32: the quantized weights alone) and "default" (bf16; for
    W4A4/W8A8 formats compressed-tensors also fake-quantizes each Linear's input). Plain checkpoints
    are run with their weights in fp32 and in bf16.
    """
    import warnings

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

    from tfcompile.calibration.corpus import iter_token_blocks, python_doc_texts

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    heldout_texts = python_doc_texts("heldout", corpus_root)
    rows = []
    for d in dirs:
        tok = AutoTokenizer.from_pretrained(d)
        blocks = torch.tensor(list(iter_token_blocks(tok, heldout_texts, s.seq_len, s.eval_tokens // s.seq_len)))
        quantized = "quantization_config" in json.loads((d / "config.json").read_text())
        fmt = "-"
        if quantized:
            manifest = d / "tfcompile" / "manifest.json"
            fmt = json.loads(manifest.read_text())["recipe"].get("format", "?") if manifest.exists() else "?"
        modes = (("weights", dict(dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))),
                 ("default", dict(dtype=torch.bfloat16))) if quantized else \
                (("fp32", dict(dtype=torch.float32)), ("bf16", dict(dtype=torch.bfloat16)))
        row = {"dir": str(d), "format": fmt}
        for mode, kw in modes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModelForCausalLM.from_pretrained(d, **kw).eval()
            row[mode] = round(perplexity(model, blocks), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0


def training_md(f: dict, args) -> str:
    s = f["setup"]
    name = "demo-gemma" if s["family"] == "gemma3" else "demo-lm"
    cmd = f"python scripts/train_demo_lm.py examples/{name} --overwrite" + (
        " --family gemma3" if s["family"] == "gemma3" else "") + (
        f" --minutes {args.minutes:g}" if args.minutes != 25.0 else "") + (
        f" --steps {args.steps}" if args.steps is not None else "") + (
        f" --threads {args.threads}" if args.threads != 2 else "") + (" --smoke" if args.smoke else "")
    if args.steps is not None or args.smoke:
        reproduce = (f"The cosine schedule spans a fixed {f['steps']} steps and the data order follows the seed,\n"
                     "so a rerun with the same thread count does the same arithmetic; on the same CPU and torch\n"
                     "build it should give the same weights (the `--smoke` run is byte-identical across reruns;\n"
                     "this full run was not repeated). The `--minutes` budget still stops a slower machine early.")
    else:
        reproduce = ("The cosine schedule followed wall time (`--minutes`), so the step count depends on the\n"
                     f"machine's speed; `--steps {f['steps']}` gives a fixed schedule of the same length.")
    arch = f.get("architecture", "LlamaForCausalLM")
    head = "tied (scaled) embeddings" if s["family"] == "gemma3" else "untied lm_head"
    return f"""# {name}: how it was trained

A {f['parameters'] / 1e6:.2f}M-parameter {arch} trained from scratch by this
repository's `scripts/train_demo_lm.py`, to give tfcompile a real (trained, not
random) causal LM to quantize and evaluate.

- **Text**: Debian bookworm package `python3.11-doc`, the reStructuredText
  sources of the Python 3.11 documentation,
  `/usr/share/doc/python3.11/html/_sources/**/*.rst.txt`, split by file with a
  sha256 hash of the relative path (`tfcompile.calibration.corpus`): train
  90% ({f['train_files']} files, {f['train_tokens']} tokens in blocks of {s['seq_len']}), calib 5%,
  heldout 5% ({f['heldout_files']} files). No text is stored in the repository.
- **Tokenizer**: byte-level BPE, {s['vocab']} tokens (`<unk>`=0, `<s>`=1, `</s>`=2, `<pad>`=3),
  trained with `tokenizers` on the train split; it prepends `<s>`, and every
  document ends with `</s>` in the training stream.
- **Model**: hidden {s['hidden']}, intermediate {s['intermediate']}, {s['layers']} layers,
  {s['heads']} heads of {s['hidden'] // s['heads']}, {s['kv_heads']} KV heads, {head},
  max positions {s['seq_len']}; {f['parameters']} parameters; weights saved in bf16.
- **Training**: fp32 on CPU ({f['threads']} thread(s), {f['machine']}, torch {f['torch']}), seed {f['seed']},
  AdamW (lr {s['lr']:g}, betas 0.9/0.95, weight decay {s['weight_decay']:g} on matrices), {s['warmup']} warmup
  steps then cosine to 10%, grad clip 1.0, batch {s['batch']} x {s['seq_len']} tokens.
  {f['steps']} steps ({f['stopped_by']}), {f['tokens_seen']} tokens seen, {f['train_seconds']:.0f} s
  training loop, {f['total_seconds']:.0f} s in all.
- **Held-out perplexity** (token-level, first {f['heldout_tokens']} tokens of the heldout
  split in blocks of {s['seq_len']}, {f['heldout_predicted_tokens']} predicted tokens):
  {f['ppl_before']:.2f} before training, {f['ppl_after_fp32']:.2f} after (fp32),
  **{f['ppl_after_bf16']:.2f}** with the saved bf16 weights.

Command:

```bash
apt-get install -y python3.11-doc
{cmd}
```

{reproduce}
Figures are also in `training.json` (written by the same run).
"""


if __name__ == "__main__":
    sys.exit(main())
