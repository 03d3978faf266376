"""Calibration tokens: from local files or data sets through `datasets`, or from the model.

`calibration_tokens(source, ...)` returns int64 token ids [samples, seq_len].
`source` is one of:
- a local file: .txt (one document per line), .jsonl / .json, .csv, .parquet,
  read with the `datasets` library's builders of the same name;
- a directory written by `Dataset.save_to_disk` (it holds state.json /
  dataset_info.json), read with `datasets.load_from_disk`;
- any other string: a data set name already in the local Hugging Face cache
  (`datasets.load_dataset(name, split="train")` in offline mode, for that call only:
  nothing is downloaded);
- "python-doc": the calibration split of Debian's python3.11-doc prose
  (`calibration.corpus`; disjoint from the held-out split `tfcompile eval` uses);
- "stdlib-docstrings": the docstrings of the running Python's standard library, read with
  `ast` (calibration.stdlib_text; every Python install has them, nothing is downloaded);
- "self": short sequences sampled from the model itself, packed (calibration.sampling: the
  cost follows the token count, like the calibration forward's);
- "random": uniform random token ids (fast, but unlike real activations);
- "auto" (the default): the first of TEXT_SOURCES ("python-doc", then "stdlib-docstrings")
  that is installed, that the model's tokenizer encodes faithfully and that holds the tokens
  needed (`text_encodes`); else "self" (else "random", for a model that cannot generate).
  Real prose gives the activation statistics of real text and costs a tokenization; model
  samples need no data but cost a bounded generation (docs/design.md "Calibration data").

Text comes from a "text" column, else the first string column; a "messages"
column (chat format) goes through the tokenizer's chat template when it has
one. Documents are shuffled with `seed`, tokenized, concatenated with EOS
between them, and cut into `samples` blocks of `seq_len` tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from tfcompile.calibration.corpus import python_doc_files, python_doc_texts
from tfcompile.calibration.sampling import sample_from_model
from tfcompile.calibration.stdlib_text import NAME as STDLIB, stdlib_texts
from tfcompile.errors import UserError

BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".csv": "csv",
            ".parquet": "parquet"}
TEXT_SOURCES = ("python-doc", STDLIB)  # the text `auto` tries, in this order, before `self`
SPECIAL = ("auto", "self", "random", *TEXT_SOURCES)
AUTO_MARGIN = 1.25  # auto picks a text when it holds this many times the tokens needed
PROBE_CHARS = 4000  # the round-trip check's sample: the first document's first characters


def calibration_tokens(source: str, tokenizer: Any, *, samples: int, seq_len: int, seed: int,
                       model: Any = None, vocab: int | None = None, progress: Any = None) -> torch.Tensor:
    """int64 [samples, seq_len] token ids for calibration (see the module doc for `source`)."""
    if samples <= 0 or seq_len <= 0:
        raise UserError(f"calibration needs positive --calib-samples and --calib-seq-len "
                        f"(got {samples} x {seq_len})", hint="e.g. --calib-samples 64 --calib-seq-len 512")
    source = effective_source(source, model, tokenizer, vocab=vocab, tokens=samples * seq_len)
    if source == "random":
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, int(vocab), (samples, seq_len), generator=gen)
    if source == "self":
        return sample_from_model(model, tokenizer, samples=samples, seq_len=seq_len, seed=seed,
                                 progress=progress)
    texts = load_texts(source, tokenizer, seed)
    return pack_blocks(texts, tokenizer, samples=samples, seq_len=seq_len, source=source)


def effective_source(source: str, model: Any, tokenizer: Any = None, *, vocab: int | None = None,
                     tokens: int = 0) -> str:
    """The source calibration really uses: `auto` resolves to the first of TEXT_SOURCES that
    `text_encodes`, else `self` (module doc); `self` needs a model that can sample text (a causal
    LM); one that cannot (an encoder such as BertModel) calibrates on `random` ids instead, and the
    statistics are labelled with that. `tokens`: samples x seq_len, the tokens `auto` must find."""
    if source == "auto":
        source = auto_source(tokenizer, vocab, tokens)[0]
    if source != "self":
        return source
    can = getattr(model, "can_generate", None)
    return "self" if (can() if callable(can) else hasattr(model, "generate")) else "random"


def auto_source(tokenizer: Any, vocab: int | None, tokens: int) -> tuple[str, tuple[str, ...]]:
    """(what `auto` picks: the first of TEXT_SOURCES that `text_encodes`, else "self"; why each text
    source before it was passed over, e.g. "python-doc: ... missing"). A non-empty second item is a
    fallback: the statistics, and so the artifact, differ from a machine that has the first source."""
    refused = []
    for s in TEXT_SOURCES:
        why = text_refusal(s, tokenizer, vocab, tokens)
        if why is None:
            return s, tuple(refused)
        refused.append(f"{s}: {why}")
    return "self", tuple(refused)


def fallback_message(choice: str, refused: tuple[str, ...]) -> str:
    """The warning (or, under calibrate.strict, the error) for an `auto` that fell back."""
    return (f"calibrate: --calib auto fell back to {choice} ({'; '.join(refused)}); the statistics, and so "
            f"the artifact's bytes, differ from a run on a machine that has {TEXT_SOURCES[0]}")


FALLBACK_HINT = ("install the text (apt-get install python3.11-doc), or name the calibration data "
                 "(--calib FILE | python-doc | stdlib-docstrings | self); --calib-strict fails instead of "
                 "falling back")


def text_encodes(source: str, tokenizer: Any, vocab: int | None, tokens: int) -> bool:
    """True when text source `source` (one of TEXT_SOURCES) can serve `auto` (`text_refusal`)."""
    return text_refusal(source, tokenizer, vocab, tokens) is None


def text_refusal(source: str, tokenizer: Any, vocab: int | None, tokens: int) -> str | None:
    """Why text source `source` (one of TEXT_SOURCES) cannot serve `auto`, or None when it can: it
    is installed, `tokenizer` round-trips its first document (decode(encode(text)) equals text but
    for whitespace, no unknown token, every id below `vocab`) and it holds about AUTO_MARGIN x
    `tokens` tokens (estimated from the first document's characters per token; the stdlib's files
    are parsed only until that many)."""
    if tokenizer is None:
        return "the checkpoint has no tokenizer"
    try:
        docs = iter(python_doc_texts("calib") if source == "python-doc" else stdlib_texts())
        first = next(docs, "")
    except UserError as e:  # python3.11-doc not installed; no stdlib sources
        return e.message
    sample = first[:PROBE_CHARS]
    ids = tokenizer(sample, add_special_tokens=False)["input_ids"] if sample else []
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or (unk is not None and unk in ids) or (vocab is not None and max(ids) >= vocab):
        return "the tokenizer does not encode it (unknown or out-of-vocabulary tokens)"
    if "".join(tokenizer.decode(ids).split()) != "".join(sample.split()):
        return "the tokenizer does not round-trip it"
    need = AUTO_MARGIN * tokens * len(sample) / len(ids)  # characters
    have = len(first)
    for text in docs:
        if have >= need:
            break
        have += len(text)
    return None if have >= need else f"it holds fewer than {AUTO_MARGIN} x {tokens} tokens"


def installed_text_source() -> str:
    """The first of TEXT_SOURCES installed here, without the tokenizer check: what `auto` means
    where `self` is refused (a decoded published checkpoint, passes/calibrate.py)."""
    try:
        python_doc_files("calib")
    except UserError:  # python3.11-doc not installed: the stdlib's docstrings are always there
        return STDLIB
    return "python-doc"


def tokens_sha256(ids: torch.Tensor) -> str:
    """sha256 of the calibration token ids as int64 little-endian bytes, row-major: the manifest's
    record of what calibration saw (the text, its order, the tokenizer and the seed together)."""
    return hashlib.sha256(ids.to(torch.int64).contiguous().numpy().astype("<i8").tobytes()).hexdigest()


def load_texts(source: str, tokenizer: Any, seed: int) -> Iterable[str]:
    """Documents of the data set, shuffled deterministically."""
    if source == STDLIB:  # lazy: pack_blocks parses files only until it has the tokens
        return stdlib_texts(seed)
    if source == "python-doc":
        texts = python_doc_texts("calib")
        order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
        return [texts[i] for i in order]
    ds = _open(source)
    column = _text_column(ds, source)
    if column == "messages":
        if not getattr(tokenizer, "chat_template", None):
            raise UserError(f"calibration data {source}: a 'messages' column needs a tokenizer "
                            "with a chat template", hint="give a 'text' column instead")
        texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in ds["messages"]]
    else:
        texts = [t for t in ds[column] if isinstance(t, str) and t.strip()]
    if not texts:
        raise UserError(f"calibration data {source}: no text found", hint="check the file's contents")
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[i] for i in order]


def _open(source: str):
    import datasets  # lazy: the datasets library (~1 s); only for a file or data-set source

    datasets.disable_progress_bars()
    path = Path(source)
    try:
        if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_info.json").exists()):
            ds = datasets.load_from_disk(str(path))
            return ds["train"] if isinstance(ds, datasets.DatasetDict) else ds
        if path.is_file():
            builder = BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise UserError(f"calibration data {path}: unknown file type {path.suffix!r}",
                                hint="use .txt, .jsonl, .json, .csv or .parquet")
            return datasets.load_dataset(builder, data_files=str(path), split="train")
        if path.exists() or os.sep in source or source.startswith("."):
            raise UserError(f"calibration data {source}: not a file or a saved data set",
                            hint="give a .txt/.jsonl/.json/.csv/.parquet file or a save_to_disk folder")
        with hub_offline(datasets):  # the cache only: never download at run time
            return datasets.load_dataset(source, split="train")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; name the source
        raise UserError(f"calibration data {source}: cannot load it ({type(e).__name__}: {e})",
                        hint="local files, save_to_disk folders and data sets already in the "
                             "Hugging Face cache work offline; or use --calib self") from None


@contextlib.contextmanager
def hub_offline(datasets) -> Iterator[None]:
    """Offline mode for this call only: `datasets` and huggingface_hub read HF_HUB_OFFLINE /
    HF_DATASETS_OFFLINE once, at import, into module constants; those are set for the block and
    restored after it (an environment variable set now would change nothing, and setting it
    would leak into the rest of the process)."""
    import huggingface_hub.constants as hub  # lazy: only a data set name reaches here (datasets' dependency)

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE = saved


def _text_column(ds, source: str) -> str:
    names = list(ds.column_names)
    if "text" in names:
        return "text"
    if "messages" in names:
        return "messages"
    for n in names:
        if ds.features[n].dtype == "string":
            return n
    raise UserError(f"calibration data {source}: no text column (columns: {names})",
                    hint="name the column 'text'")


def pack_blocks(texts: Iterable[str], tokenizer: Any, *, samples: int, seq_len: int, source: str) -> torch.Tensor:
    """Tokenize, join with EOS and cut `samples` blocks of `seq_len` tokens."""
    need = samples * seq_len
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise UserError(f"calibration data {source}: {len(ids)} tokens, {need} needed "
                        f"({samples} x {seq_len})", hint="lower --calib-samples/--calib-seq-len or give more text")
    return torch.tensor(ids[:need], dtype=torch.int64).reshape(samples, seq_len)
