"""English text every Python install has offline: the docstrings of the standard library.

`--calib stdlib-docstrings`, and the default `auto`'s second choice when Debian's python3.11-doc
(calibration/corpus.py) is not installed (calibration/datasets.py). Nothing is downloaded.

Source: the `.py` files under `sysconfig.get_path("stdlib")` of the interpreter running tfcompile
(CPython 3.11's: about 730 files, 1.8 MB of docstrings, ~0.45 M SmolLM2 tokens), leaving out
`site-packages` / `dist-packages` and the test suites (folders `test`, `tests`, `idle_test`).
Each file is parsed with `ast`, never imported or executed; its docstrings (module, classes and
functions, in source order, as `ast.get_docstring` cleans them) joined by blank lines are one
document. A file that does not parse or holds no docstring is left out.

Order: files sorted by their POSIX path relative to the stdlib folder (the same on every machine),
shuffled by the calibration seed like every text source, and parsed lazily in that order: the
cost follows the tokens taken (a few files for 16 x 512 tokens; parsing all of them takes ~4 s).
The bytes depend on the Python version (3.11.2 and 3.11.7 differ in a few docstrings); the
manifest records the sha256 of the calibration token ids (passes/manifest.py), so two artifacts
calibrated on different text can be told apart.
"""

from __future__ import annotations

import ast
import functools
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

from tfcompile.errors import UserError

NAME = "stdlib-docstrings"  # the --calib value
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
HINT = ("this Python has no standard-library sources (.py files; e.g. Debian: apt-get install "
        "libpython3.11-stdlib); give --calib FILE or --calib self")
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder (a venv's base interpreter's)."""
    return Path(sysconfig.get_path("stdlib"))


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The stdlib's `.py` files outside SKIP_DIRS, sorted by POSIX path relative to `root`."""
    root = Path(root) if root is not None else stdlib_root()
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]  # prune: never walk the test suites
        found += [Path(here, f) for f in files if f.endswith(".py")]
    if not found:
        raise UserError(f"calibration data {NAME}: no .py file under {root}", hint=HINT)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4096)
def file_docstrings(path: Path) -> str:
    """The docstrings of one source file in source order, joined by blank lines ("" if none or
    the file does not parse). `ast.parse` only: nothing in the file runs."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):  # ValueError: a null byte; OSError: unreadable
        return ""
    docs = []
    stack = [tree]
    while stack:  # depth first, children in source order (also a def inside an `if` or `try`)
        node = stack.pop()
        if isinstance(node, _DOC_NODES):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                docs.append(doc.strip())
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return "\n\n".join(docs)


def stdlib_texts(seed: int | None = None, root: str | Path | None = None) -> Iterator[str]:
    """One document per file with docstrings, files in sorted order (`seed` None) or shuffled by
    `seed` (torch.randperm, as calibration.datasets shuffles every text source); lazy."""
    files = stdlib_files(root)
    order = range(len(files)) if seed is None else \
        torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    for i in order:
        text = file_docstrings(files[i])
        if text:
            yield text
