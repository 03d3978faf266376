"""`stdlib-docstrings`: the standard library's docstrings as calibration text, and `auto`'s order
python-doc -> stdlib-docstrings -> self (calibration/stdlib_text.py, calibration/datasets.py)."""

from __future__ import annotations

import json

import pytest
import torch

from tfcompile.calibration import corpus, stdlib_text
from tfcompile.calibration.datasets import (calibration_tokens, effective_source, installed_text_source,
                                            text_encodes, tokens_sha256)
from tfcompile.calibration.stdlib_text import file_docstrings, stdlib_files, stdlib_texts
from tfcompile.errors import UserError

# A fake stdlib: (relative path, source, the document the spec says it gives).
FILES = [
    ("b.py", '"""Module b."""\n\nclass C:\n    """Class C.\n\n    More about C.\n    """\n\n'
             '    def m(self):\n        """Method m."""\n\n\ndef f():\n    """Function f."""\n',
     "Module b.\n\nClass C.\n\nMore about C.\n\nMethod m.\n\nFunction f."),
    ("a.py", 'import sys\nif sys.platform:\n    def g():\n        """Inside an if."""\n'
             'async def h():\n    """Async h."""\n', "Inside an if.\n\nAsync h."),
    ("pkg/__init__.py", '"""Package docs."""\nraise SystemExit("imported!")\n', "Package docs."),
    ("pkg/z.py", "x = 1  # no docstring\n", ""),
    ("bad.py", '"""Never seen."""\ndef (:\n', ""),  # does not parse
    ("test/t.py", '"""A test suite."""\n', None),  # pruned folders: never read
    ("site-packages/s.py", '"""Installed package."""\n', None),
    ("idlelib/idle_test/i.py", '"""Idle tests."""\n', None),
]


@pytest.fixture
def fake_stdlib(tmp_path):
    root = tmp_path / "lib" / "python3.11"
    for rel, src, _ in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(src)
    (root / "notes.txt").write_text('"""not python"""')
    file_docstrings.cache_clear()
    return root


@pytest.fixture(scope="module")
def tok(model_factory, tmp_path_factory):
    """A byte-level BPE with all 256 byte symbols (vocab 512): any text round-trips."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_factory.make_tiny_llama(tmp_path_factory.mktemp("m") / "m",
                                                                        vocab=512))


def test_documents_follow_the_spec(fake_stdlib):
    """Sorted relative paths; test suites and installed packages pruned; docstrings in source order
    (a def inside an `if` too), cleaned, joined by blank lines; nothing executed; broken or empty
    files left out."""
    rel = [p.relative_to(fake_stdlib).as_posix() for p in stdlib_files(fake_stdlib)]
    assert rel == ["a.py", "b.py", "bad.py", "pkg/__init__.py", "pkg/z.py"]
    want = {r: d for r, _, d in FILES if d is not None}
    assert list(stdlib_texts(None, fake_stdlib)) == [want[r] for r in rel if want[r]]


def test_the_seed_shuffles_files_like_every_text_source(fake_stdlib):
    files = stdlib_files(fake_stdlib)
    for seed in (0, 1, 7):
        order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
        want = [file_docstrings(files[i]) for i in order]
        assert list(stdlib_texts(seed, fake_stdlib)) == [d for d in want if d]


def test_the_real_stdlib_gives_the_same_bytes_twice(tok):
    """Two runs, the parse cache cleared between them: the same token ids (the manifest's sha256)."""
    a = calibration_tokens("stdlib-docstrings", tok, samples=4, seq_len=256, seed=3)
    file_docstrings.cache_clear()
    b = calibration_tokens("stdlib-docstrings", tok, samples=4, seq_len=256, seed=3)
    assert torch.equal(a, b) and tokens_sha256(a) == tokens_sha256(b)
    assert not torch.equal(a, calibration_tokens("stdlib-docstrings", tok, samples=4, seq_len=256, seed=4))
    # the documents are the docstrings of the files in the seed's order: each one's first line is
    # in the raw source of the next file (in that order) that has docstrings
    files = stdlib_files()
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(3)).tolist()
    sources = (files[i].read_text(encoding="utf-8", errors="replace") for i in order if file_docstrings(files[i]))
    pieces = tok.decode(a.flatten()).split(tok.eos_token)[:-1]  # whole documents only
    assert len(pieces) >= 2
    for piece, src in zip(pieces, sources):
        assert piece.splitlines()[0].strip() in src


def test_tokens_sha256_is_of_int64_little_endian_rows():
    import hashlib
    import struct

    ids = torch.tensor([[1, 2], [300, 70000]], dtype=torch.int32)
    want = hashlib.sha256(struct.pack("<4q", 1, 2, 300, 70000)).hexdigest()
    assert tokens_sha256(ids) == want


def test_auto_tries_python_doc_then_the_stdlib_then_self(tok, tiny_llama_src, monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_src)
    assert effective_source("auto", model, tok, vocab=512, tokens=256) == "python-doc"
    monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python3.11-doc")
    assert not text_encodes("python-doc", tok, 512, 256)
    assert effective_source("auto", model, tok, vocab=512, tokens=256) == "stdlib-docstrings"
    assert installed_text_source() == "stdlib-docstrings"
    # more tokens than the stdlib holds (~0.45 M SmolLM2 tokens), or ids beyond the vocabulary: self
    assert effective_source("auto", model, tok, vocab=512, tokens=10**8) == "self"
    assert effective_source("auto", model, tok, vocab=300, tokens=256) == "self"
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(stdlib_text, "stdlib_root", lambda: tmp_path / "empty")  # a Python without sources
    assert effective_source("auto", model, tok, vocab=512, tokens=256) == "self"


def test_errors_name_the_source_and_hint(tok, tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"stdlib-docstrings: no \.py file under") as e:
        stdlib_files(tmp_path)
    assert "libpython3.11-stdlib" in e.value.hint and "--calib FILE" in e.value.hint
    with pytest.raises(UserError, match=r"stdlib-docstrings: \d+ tokens, 4000000 needed") as e:
        calibration_tokens("stdlib-docstrings", tok, samples=1000, seq_len=4000, seed=0)
    assert "lower --calib-samples" in e.value.hint


def test_quantize_falls_back_to_the_stdlib_without_python_doc(model_factory, tmp_path, run_cli, monkeypatch):
    """No python3.11-doc: the default calibration reads the stdlib's docstrings (not `self`), and
    the manifest records what it saw (sha256 of the token ids)."""
    model = model_factory.make_tiny_llama(tmp_path / "m", vocab=512)
    monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python3.11-doc")
    out = tmp_path / "out"
    res = run_cli("quantize", model, "-o", out, "--format", "fp8", "--calib-samples", "2", "--calib-seq-len", "32",
                  "--json")
    assert res.code == 0, res.err
    assert res.json()["passes"]["calibrate"]["source"] == "stdlib-docstrings(seed=0)"
    from transformers import AutoTokenizer

    want = calibration_tokens("stdlib-docstrings", AutoTokenizer.from_pretrained(model), samples=2, seq_len=32,
                              seed=0)
    manifest = json.loads((out / "tfcompile" / "manifest.json").read_text())
    manifest["calibration"].pop("compute_dtype")  # tests/calibration/test_compute_dtype.py
    fallback = manifest["calibration"].pop("fallback")  # a fallback is said (test_auto_fallback.py)
    assert manifest["calibration"] == {"data": "stdlib-docstrings(seed=0)", "tokens": 64,
                                       "tokens_sha256": tokens_sha256(want)}
    assert fallback in res.json()["warnings"]
