"""English text for calibration and evaluation: the Python 3.11 documentation.

Source: Debian's `python3.11-doc` package (bookworm: 3.11.2-6+deb12u*), the
reStructuredText sources of docs.python.org that Sphinx ships next to the
HTML, `/usr/share/doc/python3.11/html/_sources/**/*.rst.txt` (497 files,
about 11 MB of English prose with reST markup and code samples). Nothing is
downloaded and no text is committed to this repository: install the package
(`apt-get install python3.11-doc`).

Splits are by whole file, decided by a stable hash of the file's path
relative to `_sources` (sha256 of the POSIX path, so the same on every
machine and independent of directory listing order):

    bucket = int(sha256(relpath)[:8], 16) % 100
    train    bucket <  90     the demo LM's tokenizer and weights are trained on it
    calib    90 <= bucket < 95   calibration samples (never trained on)
    heldout  bucket >= 95     perplexity only; never trained or calibrated on

The three splits are disjoint and together cover every file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.settings import settings

# TFCOMPILE_PYTHON_DOC: the same `_sources` folder elsewhere (e.g. unpacked from the .deb on a non-Debian machine)
PYTHON_DOC_DIR = settings().python_doc
PYTHON_DOC_HINT = "apt-get install python3.11-doc"
SPLITS = ("train", "calib", "heldout")
_BOUNDS = {"train": (0, 90), "calib": (90, 95), "heldout": (95, 100)}


def split_of(relpath: str) -> str:
    """The split a file belongs to, from its POSIX path relative to `_sources`."""
    bucket = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16) % 100
    return next(s for s, (lo, hi) in _BOUNDS.items() if lo <= bucket < hi)


def python_doc_files(split: str, root: str | Path | None = None) -> list[Path]:
    """The `*.rst.txt` files of `split`, sorted by relative path."""
    if split not in _BOUNDS:
        raise UserError(f"unknown corpus split {split!r}", hint=f"use one of {', '.join(SPLITS)}")
    root = Path(root) if root is not None else PYTHON_DOC_DIR
    if not root.is_dir():
        raise UserError(f"Python documentation sources not found: {root} is missing", hint=PYTHON_DOC_HINT)
    files = sorted(root.rglob("*.rst.txt"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UserError(f"Python documentation sources not found: no *.rst.txt under {root}", hint=PYTHON_DOC_HINT)
    return [p for p in files if split_of(p.relative_to(root).as_posix()) == split]


def python_doc_texts(split: str, root: str | Path | None = None) -> list[str]:
    """The texts of `split`, one per file, in sorted path order (deterministic).

    Text is the file decoded as UTF-8 with `\\r\\n` normalised to `\\n` and
    trailing whitespace removed; empty files are left out.
    """
    texts = []
    for path in python_doc_files(split, root):
        text = path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n").rstrip()
        if text:
            texts.append(text)
    return texts


def iter_token_blocks(tokenizer, texts: Iterable[str], seq_len: int,
                      max_blocks: int | None = None, *, batch: int = 64) -> Iterator[list[int]]:
    """Fixed-length blocks of `seq_len` token ids from `texts`, in order.

    Each text is tokenised with the tokenizer's own special tokens (a BOS if
    it adds one) and followed by its EOS; the texts are concatenated into one
    stream that is cut into consecutive blocks, so a block may span two
    documents. The incomplete tail is dropped. Stops after `max_blocks`.
    """
    if seq_len <= 0:
        raise ValueError("seq_len must be positive")
    eos = getattr(tokenizer, "eos_token_id", None)
    buf: list[int] = []
    done = 0
    texts = list(texts)
    for start in range(0, len(texts), batch):
        for ids in tokenizer(texts[start:start + batch])["input_ids"]:
            buf.extend(ids)
            if eos is not None and (not ids or ids[-1] != eos):
                buf.append(eos)
        while len(buf) >= seq_len:
            if max_blocks is not None and done >= max_blocks:
                return
            yield buf[:seq_len]
            del buf[:seq_len]
            done += 1
        if max_blocks is not None and done >= max_blocks:
            return
