"""`pydoc-cloze`: a small multiple-choice cloze task for lm-eval, built from text on the machine.

Source: the calib and held-out splits of Debian's python3.11-doc (tfcompile.calibration.corpus;
the demo LM never trained on them). Each document is one English sentence of the docs' prose: the context is the
sentence up to its last word, the choices are that word and three distractors (last words of other
sentences, drawn with a fixed seed), the label is the position of the true word. Nothing is
downloaded and no text is committed: `build()` writes `pydoc_cloze.jsonl` and the task YAML
(`pydoc_cloze.yaml`, the template shipped beside this module with the data path filled in) into a
folder, by default under the tfcompile cache, and returns the YAML's path for `--task`.

Deterministic: the same python3.11-doc gives the same bytes (sorted files, seeded choices).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from tfcompile.calibration.corpus import python_doc_texts
from tfcompile.io.jsonfile import write_bytes
from tfcompile.settings import settings

NAME = "pydoc-cloze"  # the --task name; the lm-eval task in the YAML is `pydoc_cloze`
TASK = "pydoc_cloze"
TEMPLATE = Path(__file__).with_name("pydoc_cloze.yaml")
DATA_MARK = "@DATA_DIR@"  # replaced in the template by the folder holding the JSONL
SEED = 0
DOCS = 400  # sentences kept (the first DOCS eligible ones, in file order)
CHOICES = 4
_WORD = re.compile(r"[A-Za-z]{4,}")  # a last word: letters only, at least 4
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_ROLE = re.compile(r":[a-z:]+:`~?!?([^`<]*?)\s*(?:<[^>]*>)?`")  # :func:`name <target>` -> name
_LITERAL = re.compile(r"``([^`]+)``|\*\*?([^*]+)\*\*?")  # ``code``, *emphasis* -> their text
_MARKUP = re.compile(r"[`*|<>\[\]{}=#\\]|\b_|_\s")  # what is left of reST markup: not prose


def prose_sentences(text: str) -> list[str]:
    """Sentences of the plain paragraphs of one reST file (markup, code and short lines left out)."""
    out = []
    for para in text.split("\n\n"):
        lines = para.split("\n")
        if any(ln.startswith((" ", "\t", "..", "--", "==", "**")) for ln in lines):
            continue  # indented (code, directives) or headings
        flat = " ".join(ln.strip() for ln in lines).strip()
        flat = _LITERAL.sub(lambda m: m[1] or m[2], _ROLE.sub(r"\1", flat))
        for s in _SENTENCE.split(flat):
            words = s.split()
            if 8 <= len(words) <= 40 and s.endswith(".") and not _MARKUP.search(s):
                out.append(s)
    return out


def documents(texts: list[str], docs: int = DOCS, seed: int = SEED) -> list[dict]:
    """[{context, choices, label}]: the first `docs` sentences whose last word is a plain word."""
    items = []
    for text in texts:
        for s in prose_sentences(text):
            head, _, last = s[:-1].rpartition(" ")
            if _WORD.fullmatch(last) and head:
                items.append((head, last))
    items = items[:docs]
    words = sorted({w for _, w in items})
    rng = random.Random(seed)
    out = []
    for head, last in items:
        pool = [w for w in rng.sample(words, min(len(words), CHOICES + 2)) if w != last][:CHOICES - 1]
        choices = pool + [last]
        rng.shuffle(choices)
        out.append({"context": head, "choices": choices, "label": choices.index(last)})
    return out


def default_dir() -> Path:
    return settings().cache_dir / "tasks" / TASK


def build(out_dir: Path | None = None, *, docs: int = DOCS) -> Path:
    """Write the JSONL and the YAML into `out_dir` (each atomically); the YAML's path."""
    out_dir = Path(out_dir) if out_dir is not None else default_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = documents(python_doc_texts("heldout") + python_doc_texts("calib"), docs)
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    _write(out_dir / f"{TASK}.jsonl", data)
    yaml = TEMPLATE.read_text(encoding="utf-8").replace(DATA_MARK, str(out_dir.resolve()))
    _write(out_dir / f"{TASK}.yaml", yaml)
    return out_dir / f"{TASK}.yaml"


def _write(path: Path, text: str) -> None:
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return  # rebuilt identical: leave the file (and datasets' cache of it) alone
    write_bytes(path, text.encode("utf-8"), atomic=True)


if __name__ == "__main__":  # python -m tfcompile.tasks.cloze [DIR]: build the task for lm-eval
    import sys

    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
