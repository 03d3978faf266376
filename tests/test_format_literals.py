"""Format facts live in the format (docs/design.md "Adding a weight format"): outside the formats
package (kernels/formats) and tfcompile/schemes.py no module branches on a format name.

Read from the source with `ast` (nothing is imported but the registries that give the names): a
format name (a `--format` scheme or a kernels/formats weight format) used as a dict-literal key or
as an operand of a comparison (`== "nvfp4"`, `in ("mxfp4", "fp8")`) is a table keyed by format
name, so a new format raises KeyError there or silently lacks the feature. Consumers ask the
format instead (`scheme.bits_per_weight`, `scheme.weights.block_scaled`, ...).

`ALLOWED` lists what could not move yet, each with its reason. It must only shrink: a listed
file that no longer needs its entry fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path


from tfcompile.kernels.formats.quantizer import WEIGHT_FORMATS
from tfcompile.schemes import SCHEMES

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("tfcompile", "passes", "kernels", "calibration")  # the distribution's source trees
OWNERS = ("kernels/formats/", "tfcompile/schemes.py")  # where format names may be compared
NAMES = frozenset(SCHEMES) | frozenset(WEIGHT_FORMATS)

# What could not move yet, {file: reason}; it must only shrink. Empty: the last three entries moved
# (the CUTLASS mainloop flavour and the sm_90a refusal ask the format's element bits; the Triton
# interpreter fallback asks whether the format's block scales are E4M3; the engine quirks in
# tfcompile/artifact/engines.py are predicates on a scheme's facts).
ALLOWED: dict[str, str] = {}


def _names(node: ast.AST) -> list[str]:
    """The format names `node` spells: a string constant, or the constants of a tuple/list/set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in NAMES]


def literal_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) for every format name used as a dict-literal key or a comparison operand."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        else:
            continue
        out += [(node.lineno, name) for op in operands for name in _names(op)]
    return sorted(out)


def _sources() -> dict[str, Path]:
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if folder == "tfcompile" and rel.split("/")[1] in ("passes", "kernels", "calibration"):
                continue  # the installed links to the top-level trees
            if not rel.startswith(OWNERS):
                out[rel] = path
    return out


USES = {rel: uses for rel, path in _sources().items() if (uses := literal_uses(path.read_text()))}


def test_the_registries_name_the_formats():
    assert {"nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"} <= NAMES
    assert len(_sources()) > 100  # the scan sees the package


def test_no_module_outside_the_formats_branches_on_a_format_name():
    bad = {rel: uses for rel, uses in USES.items() if rel not in ALLOWED}
    assert not bad, ("these modules key a table by format name or compare with one; ask the format "
                     "(kernels/formats/quantizer.py, tfcompile/schemes.py) instead: " + repr(bad))


def test_every_allowed_entry_is_still_needed():
    """(One test over the list, which is empty now: a parametrized one would be skipped.)"""
    for rel in sorted(ALLOWED):
        assert (ROOT / rel).is_file(), f"{rel} is gone: drop its ALLOWED entry"
        assert rel in USES, f"{rel} no longer compares format names: drop its ALLOWED entry"


def test_the_scan_finds_keys_and_comparisons_and_nothing_else():
    src = '''
TABLE = {"nvfp4": 16, "other": 1}
if fmt == "mxfp8" or "fp8-block" != fmt or fmt in ("fp8", "x") or fmt not in ["nvfp4a16"]:
    pass
quantize("nvfp4")          # an argument: the format asked by name, not a table
doc = {"format": "mxfp4"}  # a value, not a key
'''
    assert literal_uses(src) == [(2, "nvfp4"), (3, "fp8"), (3, "fp8-block"), (3, "mxfp8"), (3, "nvfp4a16")]
