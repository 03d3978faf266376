"""One held-out evaluation for many candidates: the reference runs once, candidates run once each.

`tfcompile eval` runs the reference, the candidate and (for its per-layer SQNR) every quantized
Linear a second time, for every artifact. A bench that scores 40 artifacts of the same model on
the same tokens needs the reference's next-token distributions only once: `HeldOut` computes
them once (float32 log-probabilities: tokens x vocab x 4 bytes, 1.6 GB for 8,192 tokens of
SmolLM2's 49,152-token vocabulary, kept in memory and cached in $TFCOMPILE_CACHE/bench/) and scores each candidate with tfcompile's own
`LogitMetrics`, so every figure equals `tfcompile eval ARTIFACT --reference MODEL --max-tokens N
--dtype D` (same text, rows, dtype and metric code; bench/acc_smollm2.py checks one row against
the CLI).

Candidates: a tfcompile artifact as `tfcompile eval` builds it (tfcompile.evaluate.models:
dequantized weights, activation and KV-cache emulation), any compressed-tensors checkpoint as
transformers + compressed-tensors load it, or any torch module with a causal-LM forward.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from tfcompile.fixtures.smollm2 import cache_root
from tfcompile.io.hashing import sha256_file
from tfcompile.evaluate.metrics import LogitMetrics
from tfcompile.evaluate.runner import DTYPES
from tfcompile.evaluate.text import batches, load_text, load_tokenizer, token_rows

SEQ_LEN = 256  # tfcompile eval's default row length
BATCH = 4
ACCURACY_DOC = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"
# calibration for every SmolLM2 bench row (acc_smollm2, peers): samples x tokens of the python-doc calib split
CALIB_SAMPLES, CALIB_SEQ = 16, 512
LLMC_PYTHON = "/work/venvs/t19-peers/bin/python"  # llm-compressor's venv (bench/peers_llmc.py runs in it)


def bench_parser(doc: str):
    """The options every SmolLM2 accuracy bench takes: --max-tokens, --only ROW..., --write-docs, --table."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=8192, help="held-out tokens scored")
    ap.add_argument("--only", nargs="+", metavar="ROW", help="measure these rows, keep the others' saved results")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--table", action="store_true", help="only print/write the table from saved results")
    return ap


class Results:
    """A bench's measured rows, kept in $TFCOMPILE_CACHE/bench/NAME.json between runs (so `--only`
    remeasures some rows and keeps the others); saved after every row."""

    def __init__(self, name: str):
        self.path = cache_root() / "bench" / f"{name}.json"

    def load(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def save(self, results: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(results, indent=1, sort_keys=True))


def _cached(path: Path, compute) -> list[torch.Tensor]:
    """The list of tensors in safetensors file `path`, computed and written there the first time."""
    from safetensors.torch import load_file, save_file

    if path.is_file():
        d = load_file(str(path))
        return [d[str(i)] for i in range(len(d))]
    out = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({str(i): t.contiguous() for i, t in enumerate(out)}, str(tmp))
    os.replace(tmp, path)
    return out


class HeldOut:
    """The held-out rows of `text` (python-doc's held-out split by default) and the reference's
    log-probabilities on them."""

    def __init__(self, reference: Path, *, max_tokens: int, dtype: str = "bfloat16", text: Path | None = None,
                 skip: int = 0):
        """skip: leading tokens of the text left out (a multiple of SEQ_LEN): the max_tokens after them
        are a sample independent of the first `skip` (bench/studies/distill_other_text.py)."""
        from transformers import AutoModelForCausalLM

        self.reference, self.dtype, self.max_tokens = Path(reference), dtype, max_tokens
        ref = AutoModelForCausalLM.from_pretrained(str(reference), dtype=DTYPES[dtype]).eval()
        vocab = int(ref.get_output_embeddings().weight.shape[0])
        rows = token_rows(load_text(text).text, load_tokenizer(self.reference), max_tokens=skip + max_tokens,
                          seq_len=SEQ_LEN, vocab=vocab)[skip // SEQ_LEN:]
        self.work = batches(rows, BATCH)
        self.tokens = sum(ids.numel() for ids in self.work)
        t0 = time.perf_counter()
        self.ref_logp = _cached(self._cache_file(), lambda: self._reference(ref))
        self.reference_seconds = time.perf_counter() - t0

    def _reference(self, ref) -> list[torch.Tensor]:
        with torch.inference_mode():
            return [torch.log_softmax(ref(input_ids=ids).logits.float(), -1) for ids in self.work]

    def _cache_file(self) -> Path:
        """$TFCOMPILE_CACHE/bench/ref-<sha256 of the weights, the token ids, the dtype>.safetensors"""
        h = hashlib.sha256()
        for f in sorted(self.reference.glob("*.safetensors")):
            h.update(sha256_file(f).encode())
        for ids in self.work:
            h.update(ids.numpy().tobytes())
        h.update(self.dtype.encode())
        return cache_root() / "bench" / f"ref-{h.hexdigest()[:16]}.safetensors"

    def score(self, model: torch.nn.Module) -> dict:
        """tfcompile eval's metrics (perplexity, KL(ref || model), top-1 agreement ...) of `model`."""
        m = LogitMetrics()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for ids, ref in zip(self.work, self.ref_logp):
                m.update(ids, model(input_ids=ids).logits, ref)
        return dict(m.result(), eval_seconds=round(time.perf_counter() - t0, 1))

    def score_artifact(self, path: Path, kv_cache: str = "auto") -> dict:
        """A tfcompile artifact, built as `tfcompile eval` builds it."""
        from tfcompile.evaluate.models import load_candidate

        cand = load_candidate(Path(path), DTYPES[self.dtype], kv_cache)
        return self.score(cand.model)

    def score_compressed_tensors(self, path: Path) -> dict:
        """Any compressed-tensors checkpoint as transformers + compressed-tensors load it (weights
        decompressed; W4A4/W8A8 schemes fake-quantize each Linear's input)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[self.dtype]).eval()
        return self.score(model)


def calib_ids(model: Path, path: Path, *, seed: int = 0, samples: int = CALIB_SAMPLES,
              seq_len: int = CALIB_SEQ) -> Path:
    """tfcompile's own `--calib python-doc` ids for this model (draw `seed`), saved (.npy) for
    llm-compressor (bench/peers.py, acc_defaults.py, studies/fp8_rounding.py)."""
    import numpy as np

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.calibration.forward import load_tokenizer

    ids = calibration_tokens("python-doc", load_tokenizer(model), samples=samples, seq_len=seq_len, seed=seed)
    np.save(path, ids.numpy())
    return path
