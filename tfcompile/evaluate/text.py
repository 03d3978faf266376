"""Evaluation text -> token rows.

The text is `--text FILE` (UTF-8 plain text) or, without it or with
`--text python-doc`, the held-out split of
`tfcompile.calibration.corpus.python_doc_texts` when that module is
installed. It is tokenized once with the reference's tokenizer (no special
tokens added), cut to `max_tokens`, and split into rows of `seq_len` tokens;
a shorter last row is kept when it has at least two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tfcompile.calibration.corpus import python_doc_texts
from tfcompile.errors import UserError
from tfcompile.evaluate.errors import EvalError

CHARS_PER_TOKEN_BOUND = 32  # text beyond max_tokens * this cannot be needed
CORPUS = "python-doc"  # --text name of the held-out corpus split (as --calib python-doc names the calib split)


@dataclass(frozen=True)
class EvalText:
    text: str
    source: str  # "file:PATH" or "tfcompile.calibration.corpus:heldout"


def load_text(path: Path | None) -> EvalText:
    if path is not None and str(path) == CORPUS:
        path = None
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise EvalError(f"evaluation text {path} does not exist or is not a file",
                            hint="pass a UTF-8 plain-text file with --text")
        try:
            return EvalText(path.read_text(encoding="utf-8"), f"file:{path}")
        except (OSError, UnicodeDecodeError) as e:
            raise EvalError(f"evaluation text {path}: cannot read it as UTF-8 ({e})",
                            hint="pass a UTF-8 plain-text file with --text") from None
    return EvalText(_corpus_texts(), "tfcompile.calibration.corpus:heldout")


def _corpus_texts() -> str:
    try:
        texts = python_doc_texts("heldout")
    except UserError as e:  # the Debian package is not installed (first run, or not Debian)
        raise EvalError(f"no evaluation text: --text (quantize: --eval-text) was not given, and the default, "
                        f"the held-out split of Debian's python3.11-doc, is not here ({e.message})",
                        hint="pass --text FILE with a few thousand words like the model's use, or install the "
                             "default: apt-get install python3.11-doc (elsewhere: set TFCOMPILE_PYTHON_DOC to "
                             "its html/_sources folder)") from None
    return texts if isinstance(texts, str) else "\n\n".join(str(t) for t in texts)


def load_tokenizer(reference: Path):
    """The reference's tokenizer (its files only: no remote code, no network)."""
    from transformers import AutoTokenizer  # lazy: transformers (~2 s to import); only when a model is built

    try:
        return AutoTokenizer.from_pretrained(str(reference), trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EvalError(f"reference {reference}: cannot load its tokenizer ({type(e).__name__}: {e})",
                        hint="the reference directory needs tokenizer files (tokenizer.json ...) "
                             "as save_pretrained writes them") from None


def token_rows(text: str, tokenizer, *, max_tokens: int, seq_len: int, vocab: int) -> list[torch.Tensor]:
    """Rows of token ids (1-D int64 tensors), at most max_tokens in all."""
    ids = tokenizer(text[: max_tokens * CHARS_PER_TOKEN_BOUND], add_special_tokens=False)["input_ids"]
    ids = torch.tensor(ids[:max_tokens], dtype=torch.long)
    if ids.numel() < 2:
        raise EvalError(f"the evaluation text gives {ids.numel()} token(s); at least 2 are needed",
                        hint="pass a longer text with --text")
    if int(ids.max()) >= vocab:
        raise EvalError(f"the tokenizer produced id {int(ids.max())}, outside the model's vocabulary "
                        f"of {vocab}", hint="the reference's tokenizer does not belong to this model")
    rows = list(ids.split(seq_len))
    if rows[-1].numel() < 2 and len(rows) > 1:
        rows.pop()
    return rows


def batches(rows: list[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    """Stack rows of equal length into [B, L] batches (a shorter last row goes alone)."""
    out: list[torch.Tensor] = []
    full = [r for r in rows if r.numel() == rows[0].numel()]
    for i in range(0, len(full), batch_size):
        out.append(torch.stack(full[i:i + batch_size]))
    out.extend(r[None] for r in rows[len(full):])
    return out
