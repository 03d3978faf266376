"""The calibration loop, the IR and the pack pass name no algorithm (issue 25 item 1).

An algorithm is one unit: its statistics are registered by their own modules (calibration/
statistics.py `register_statistic`; calibration/hessian.py, calibration/awq_stats.py), its
settings, prepare and run by its module under passes/quantize/. So the modules every algorithm
goes through must not know any of them: the loops (whole model, layer by layer, the recorders that
both install, the layer solver's propagation, and the statistic interface), the IR (tfcompile/ir.py)
and pack (passes/pack.py). Read
from the source text, comments and docstrings included (a comment naming GPTQ is how a special case
starts); a name of an algorithm or of its statistic is a hit, case-insensitive.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUARDED = ("calibration/sequential.py", "calibration/forward.py", "calibration/recorders.py",
           "calibration/propagate.py", "calibration/statistics.py", "tfcompile/ir.py", "passes/pack.py")
NAMES = re.compile(r"gptq|awq|hessian", re.IGNORECASE)

# (file, the whole stripped line): each one justified. Keep it short.
ALLOWED = {
    # the spill directory's prefix: a name on disk that released versions wrote and that
    # tfcompile/io/locks.py (WORK_PREFIXES) sweeps after a killed run, and docs/cli.md documents
    ("calibration/sequential.py", 'SPILL_PREFIX = "tfcompile-hessians-"'),
}


def hits(rel: str, text: str | None = None) -> list[tuple[int, str]]:
    """(line number, stripped line) of every line of `rel` naming an algorithm, less the allowed."""
    text = (ROOT / rel).read_text() if text is None else text
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if NAMES.search(line) and (rel, line.strip()) not in ALLOWED]


@pytest.mark.parametrize("rel", GUARDED)
def test_module_names_no_algorithm(rel):
    found = hits(rel)
    assert not found, (f"{rel} names an algorithm or its statistic (register it in the algorithm's or the "
                       f"statistic's own module instead, or justify it in ALLOWED): {found[:5]}")


def test_the_check_finds_a_name():
    """The check can fail: a line naming GPTQ in a guarded module is found, in any case."""
    assert hits("passes/pack.py", "x = 1\n    # the GPTQ owner solves it\nhessians = {}\n") == [
        (2, "# the GPTQ owner solves it"), (3, "hessians = {}")]


def test_every_allowance_is_still_needed():
    for rel, line in ALLOWED:
        assert line in [x.strip() for x in (ROOT / rel).read_text().splitlines()], (rel, line)


def algorithm_names() -> list[str]:
    """The algorithms' names, from their one light table (passes/quantize/__init__.py ALGORITHM_HELP;
    tests/cli/test_choices.py holds it equal to the registry), read without importing."""
    tree = ast.parse((ROOT / "passes" / "quantize" / "__init__.py").read_text())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "ALGORITHM_HELP")
    return [k.value for k in table.keys]


# an algorithm's name as a word of its own or the head of an identifier (gptq_solve_s), any case
ALGORITHM = re.compile(r"(?<![a-z])(" + "|".join(algorithm_names()) + r")(?![a-z])", re.IGNORECASE)


def estimate_hits(text: str) -> list[tuple[int, str]]:
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if ALGORITHM.search(line)]


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tfcompile" / "estimate").glob("*.py")))
def test_the_estimate_names_no_algorithm(rel):
    """`plan --estimate` costs an algorithm's solves from its registration (`register_algorithm(
    cost=...)`, tfcompile/ir.py SolveCost): tfcompile/estimate/ names none (its cost lives with it)."""
    found = estimate_hits((ROOT / rel).read_text())
    assert not found, f"{rel} names an algorithm (its cost belongs to its `register_algorithm(cost=...)`): {found[:5]}"


def test_the_estimate_check_finds_a_name():
    assert {"gptq", "rtn", "awq"} <= set(algorithm_names())
    assert estimate_hits('if algo == "gptq":\n    out["gptq_solve_s"] = 1  # RTN: none\n# themselves\n') == [
        (1, 'if algo == "gptq":'), (2, 'out["gptq_solve_s"] = 1  # RTN: none')]
