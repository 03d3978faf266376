"""Shared by the fuzz modules (test_safety_fuzz.py, test_safety_fuzz_json.py): running
`tfcompile` in-process under a time bound, the outcome contract, and JSON text that is deep,
huge or of odd types, placed anywhere in a document.

The contract (issue 24): exit 0 (with a verified artifact when the command writes one) or
exit 1 with `error:` and `hint:` lines; never exit 2 or a traceback, never past the time
bound, and nothing left at OUT, beside it, or in TMPDIR.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
from pathlib import Path

from hypothesis import strategies as st

from safety_helpers import leftovers

BOUND_S = 60  # one case; the slowest (a quantize then a verify) takes about a second here


class Hung(BaseException):
    """A case ran past its time bound (a BaseException: no `except Exception` swallows it)."""


@contextlib.contextmanager
def time_bound(seconds: float):
    """SIGALRM raises Hung in the main thread after `seconds` (a blocked open or read of a FIFO
    is interrupted too: Python runs the handler between the retries of the system call)."""
    def fire(signum, frame):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(*args, bound: float = BOUND_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tfcompile ARGS...` in this process, within `bound` seconds."""
    from tfcompile.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with time_bound(bound), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def check(code: int, stdout: str, err: str, tmpdir: Path, out: Path | None = None) -> None:
    """The contract for one finished command (see the module docstring)."""
    assert "Traceback" not in err, err
    assert code in (0, 1), (code, err)
    if code == 1:
        assert "error: " in err and "hint: " in err, err
        if out is not None:
            assert not out.exists(), f"a failed run left {out}"
    if out is not None:
        assert leftovers(out) == [], leftovers(out)
    assert sorted(os.listdir(tmpdir)) == [], f"left in TMPDIR: {sorted(os.listdir(tmpdir))}"


def quantize_outcome(model: Path, tmpdir: Path, *extra) -> int:
    """Quantize `model` to a sibling `out`, hold it to the contract (verify a written artifact),
    remove what it wrote; the exit code."""
    out = model.parent / "out"
    code, stdout, err = run("quantize", model, "-o", out, "-q", *extra)
    check(code, stdout, err, tmpdir, out)
    if code == 0:
        vcode, _, verr = run("verify", out)
        assert vcode == 0, verr
        shutil.rmtree(out)
    else:
        assert stdout == ""
    return code


# ---- JSON values and raw JSON text

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
JSON_ANY = st.recursive(JSON_LEAF, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                        max_leaves=12)


def deep_text(depth: int, kind: str) -> str:
    """Arrays or objects nested `depth` deep, as text (json.dumps would recurse)."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "0" + "}" * depth


# Text a parser may choke on: integers over Python's 4300-digit limit, floats that overflow,
# lone surrogates, NUL, a 100 KB string, nesting at, just over and far over the 64-level limit.
ODD_TEXT = st.one_of(
    st.sampled_from(["1" * 5000, "-" + "9" * 4400, "1e400", "-1e400", "1e-400", "-0", "NaN", "Infinity",
                     "-Infinity", str(2**64), str(-2**63 - 1), str(10**300), '"' + "x" * 100_000 + '"',
                     '"\\ud800"', '"\\u0000"', '""', "[]", "{}", "null", "true", "0.5", "-1"]),
    st.builds(deep_text, st.sampled_from([8, 62, 63, 64, 65, 1000, 100_000]), st.sampled_from(["list", "dict"])),
    JSON_ANY.map(lambda v: json.dumps(v, allow_nan=True)),
)
_MARK = "\x00odd-json\x00"


def render(doc, path: tuple, text: str) -> str:
    """json.dumps(doc) with the value at `path` (keys and indexes; () for the whole document)
    replaced by the raw JSON `text`; a missing key is added, a path through a non-container is
    cut where it stops."""
    if not path:
        return text
    doc = json.loads(json.dumps(doc, allow_nan=True))
    node = doc
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, dict):
            if last or not isinstance(node.get(key), (dict, list)):
                node[key] = _MARK
                break
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and node:
            key %= len(node)
            if last or not isinstance(node[key], (dict, list)):
                node[key] = _MARK
                break
            node = node[key]
        else:
            return text
    return json.dumps(doc, allow_nan=True).replace(json.dumps(_MARK), text)


def paths_of(doc, depth: int = 4, prefix: tuple = ()) -> list[tuple]:
    """Every key path in `doc` down to `depth` levels (lists by their first index)."""
    out = [prefix]
    if depth == 0:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths_of(v, depth - 1, prefix + (k,))
    elif isinstance(doc, list) and doc:
        out += paths_of(doc[0], depth - 1, prefix + (0,))
    return out
