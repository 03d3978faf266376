"""A pass with a new fact touches no core module (issue 25 item 3: `Context` is a fact store, not a
fixed list of feature fields). Everything of the toy is declared in this file: its fact type and key
(`fact(...)`, with the manifest section it adds), a pass that produces it and a pass that requires
it; the manager checks the schedule against the key, the context stores and type-checks the value,
and the manifest records the section, with no edit to tfcompile/pipeline/ or
tfcompile/manifest_doc.py (the test checks that neither names the toy, nor any built-in pass's fact).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import tfcompile.api  # noqa: F401  (registers the passes, which declare their facts)
from tfcompile.errors import RecipeError
from tfcompile.facts import FACTS, PRODUCERS, fact
from tfcompile.pipeline import manager
from tfcompile.pipeline import passes as P
from tfcompile.pipeline.context import Context, MissingFact
from tfcompile.recipe import PassEntry, Recipe

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ToyCount:
    """What the toy producer found: how many Linears the plan quantizes."""
    linears: int


TOY = fact("toy_count", ToyCount, "how many Linears the plan quantizes (a toy)",
           manifest=lambda ctx, v: {"toy_count": {"linears": v.linears}}, owner=__name__)


@dataclass(frozen=True)
class _Cfg:
    pass


def _make(ctx, cfg, reporter):
    """Count the planned Linears."""
    return P.PassResult(ctx.add(TOY, ToyCount(len(list(ctx.plan.targets())))), {})


def _read(ctx, cfg, reporter):
    """Read the count back (a KeyError-free typed read: ctx[TOY] is a ToyCount)."""
    seen.append(ctx[TOY].linears)
    return P.PassResult(ctx, {"linears": ctx[TOY].linears})


seen: list[int] = []


@pytest.fixture
def toy_passes():
    """Register the two toy passes through the public API (and take them out again)."""
    names = ("_toy_make", "_toy_read", "_toy_blind")
    P.register_pass("_toy_make", config=_Cfg, requires=("plan",), produces=(TOY,))(_make)
    P.register_pass("_toy_read", config=_Cfg, requires=(TOY,))(_read)
    P.register_pass("_toy_blind", config=_Cfg)(_read)  # reads TOY without declaring it
    seen.clear()
    yield
    for n in names:
        P.REGISTRY.pop(n)
    PRODUCERS[TOY.name].remove("_toy_make")


def test_a_new_fact_flows_from_its_producer_to_its_reader_and_into_the_manifest(toy_passes, tiny_llama_src,
                                                                                tmp_path):
    from tfcompile.api import quantize

    standard = list(P.SCHEDULE)
    at = standard.index("quantize")
    P.set_schedule(standard[:at] + ["_toy_make"] + standard[at:at + 1] + ["_toy_read"] + standard[at + 1:])
    try:
        ctx = quantize(tiny_llama_src, tmp_path / "out", "nvfp4a16")
    finally:
        P.set_schedule(standard)
    n = len(list(ctx.plan.targets()))
    assert n > 0 and seen == [n] and ctx[TOY] == ToyCount(n) and ctx.get(TOY) == ToyCount(n)
    assert ctx.recipe.names().index("_toy_make") < ctx.recipe.names().index("_toy_read")
    doc = json.loads((tmp_path / "out" / "tfcompile" / "manifest.json").read_text())
    assert doc["toy_count"] == {"linears": n}


def test_the_manager_rejects_a_reader_no_earlier_pass_feeds(toy_passes, tmp_path):
    with pytest.raises(RecipeError) as e:
        manager.validate(Recipe(1, "custom", (PassEntry("_toy_read", _Cfg()), PassEntry("_toy_make", _Cfg()))))
    assert "pass '_toy_read' requires toy_count, which no earlier pass produces" in e.value.message
    assert "schedule '_toy_make' before '_toy_read'" in e.value.hint


def test_reading_a_missing_fact_names_the_pass_and_the_fact(toy_passes, tmp_path):
    ctx = Context(source_path=tmp_path, out_dir=None, recipe=None)
    assert ctx.get(TOY) is None
    with pytest.raises(MissingFact) as e:
        ctx[TOY]
    assert "no fact 'toy_count' (ToyCount" in e.value.message and "produced by '_toy_make'" in e.value.message
    # under the manager, the failure also names the pass that read it
    with pytest.raises(manager.PassFailed) as e:
        manager.run(ctx, Recipe(1, "custom", (PassEntry("_toy_blind", _Cfg()),)))
    assert "pass '_toy_blind' failed" in str(e.value) and "no fact 'toy_count'" in str(e.value)
    assert isinstance(e.value.inner, MissingFact)


def test_a_fact_keeps_its_type(toy_passes, tmp_path):
    ctx = Context(source_path=tmp_path, out_dir=None, recipe=None)
    with pytest.raises(TypeError, match="fact 'toy_count' must be a ToyCount, not int"):
        ctx.add(TOY, 3)
    with pytest.raises(AttributeError, match="a pass's fact"):
        ctx.with_(toy_count=ToyCount(1))  # facts are not core fields
    with pytest.raises(ValueError, match="declared twice"):
        fact("toy_count", int, "another toy_count")
    with pytest.raises(ValueError, match="undeclared facts"):
        P.register_pass("_toy_typo", config=_Cfg, requires=("toy_cuont",))(_read)
    assert ctx.add(TOY, ToyCount(2)).present() >= {"toy_count", "source_path"}


def _code_names(path: Path) -> set[str]:
    """Attribute names and string constants in `path`'s code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    out |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}
    out |= {t.id for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) for t in [n.target]
            if isinstance(t, ast.Name)}
    return out


def test_the_core_and_the_manifest_name_no_pass_s_fact():
    """Every fact a pass declares (the built-in passes' and the toy's) is absent from the pipeline
    core (its fields, attributes and strings) and from the manifest document's code: they reach
    it through the fact's own `manifest` hook."""
    facts = set(FACTS)
    assert {"layout", "calib", "cutlass", "evaluation", "verify", "toy_count"} <= facts
    files = sorted((ROOT / "tfcompile" / "pipeline").glob("*.py")) + [ROOT / "tfcompile" / "manifest_doc.py"]
    named = {f"{p.name}: {n}" for p in files for n in _code_names(p) & facts}
    assert named == set()
    assert _code_names(ROOT / "passes" / "layout.py") & {"layout"}  # the scan sees a pass's own use
