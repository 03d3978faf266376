"""The import contract of docs/design.md "Layers": imports flow one way.

Read from the source with `ast` (nothing is imported): every module of the distribution
(tfcompile/, and passes/, kernels/, calibration/ as installed under tfcompile.*) is in one
layer of `LAYERS`, bottom first. A module may import its own layer and the layers below;
within a layer, different packages are independent (neither imports the other). There is
no import cycle, counting imports inside functions too. An import inside a function is
allowed only for a heavy dependency (`HEAVY`, directly or through the module-level imports
of the module it names), and carries a `# lazy: <reason>` comment on its line or the
comment lines right above its block of imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"tfcompile": "tfcompile", "passes": "tfcompile.passes", "kernels": "tfcompile.kernels",
            "calibration": "tfcompile.calibration"}

# Bottom first. An entry names a package (all of its modules) or a module; the longest entry
# containing a module is its layer. "tfcompile" names the root package module only.
LAYERS = [
    ["tfcompile", "tfcompile.errors", "tfcompile.settings", "tfcompile.reporter", "tfcompile.machine",
     "tfcompile.facts"],
    ["tfcompile.io", "tfcompile.kernels", "tfcompile.kernels.formats", "tfcompile.families", "tfcompile.fixtures",
     "tfcompile.engines"],
    ["tfcompile.schemes", "tfcompile.kernels.triton", "tfcompile.kernels.cutlass", "tfcompile.io.sources",
     "tfcompile.checkpoint_check", "tfcompile.dist"],
    # tfcompile.recipe: the Recipe type (its package module) and RunOptions; their build is in layer 9
    ["tfcompile.ir", "tfcompile.recipe", "tfcompile.recipe.options"],
    ["tfcompile.artifact"],
    ["tfcompile.calibration", "tfcompile.layout", "tfcompile.tune", "tfcompile.onnx_export", "tfcompile.rotate"],
    ["tfcompile.evaluate"],
    ["tfcompile.runtime", "tfcompile.distill", "tfcompile.report", "tfcompile.mixed", "tfcompile.tasks"],
    ["tfcompile.pipeline", "tfcompile.draft"],
    ["tfcompile.recipe.build", "tfcompile.estimate", "tfcompile.manifest_doc"],
    ["tfcompile.passes"],
    ["tfcompile.api"],
    ["tfcompile.cli"],
    ["tfcompile.__main__"],
]
# Third-party packages slow enough to import (or needed only on some paths) that a module may
# defer them to the function that uses them.
HEAVY = {"torch", "triton", "transformers", "datasets", "huggingface_hub", "onnx", "onnxruntime",
         "tokenizers", "modelopt", "compressed_tensors", "accelerate", "gguf",
         "lm_eval",  # lm-evaluation-harness: the optional eval extra (tfcompile/tasks), only with --task
         "yaml"}  # PyYAML: only to read a --task YAML (tfcompile/tasks/gate.py)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (a tfcompile module, or a third-party top-level package)
    line: int
    in_function: bool
    reason: str | None  # the `# lazy:` comment that covers it


def _modules() -> dict[str, Path]:
    out = {}
    for folder, prefix in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if folder == "tfcompile" and parts[0] in ("passes", "kernels", "calibration"):
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([prefix, *parts])] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The tfcompile module `name` refers to (a module, or the package of a name in it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _reason(lines: list[str], first: int, last: int) -> str | None:
    """A `# lazy:` comment on the import's lines, or on the comment/import lines right above."""
    for i in range(last, 0, -1):
        text = lines[i - 1].strip()
        if "# lazy:" in text:
            return text.split("# lazy:", 1)[1].strip()
        if i < first and not (text.startswith(("#", "from ", "import ")) or text == ""):
            return None
    return None


def _imports() -> list[Import]:
    out = []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    reason = _reason(lines, child.lineno, child.end_lineno) if in_function else None
                    for target in _targets(child, package):
                        out.append(Import(module, target, child.lineno, in_function, reason))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(source), False)
    return out


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = package
            for _ in range(node.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{base}" if base else pkg
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        if name == "tfcompile" or name.startswith("tfcompile."):
            resolved = _resolve(name)
            if resolved:
                out.append(resolved)
        else:
            out.append(name.split(".")[0])
    return out


IMPORTS = _imports()


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the entry that places it)."""
    best = None
    for i, entries in enumerate(LAYERS):
        for e in entries:
            hit = module == e if e == "tfcompile" else module == e or module.startswith(e + ".")
            if hit and (best is None or len(e) > len(best[1])):
                best = (i, e)
    if best is None:
        raise KeyError(module)
    return best


def _internal() -> list[Import]:
    return [i for i in IMPORTS if i.target in MODULES and i.target != i.module]


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), every import counted."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in _internal():
        graph[i.module].add(i.target)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _heavy_closure() -> dict[str, set[str]]:
    """Module -> the HEAVY packages importing it brings in: what its module-level imports reach,
    transitively, including the `__init__` of every parent package (which runs first)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if not i.in_function and i.target != i.module:
            edges[i.module].add(i.target)
    for m in MODULES:
        parent = m.rpartition(".")[0]
        if parent in MODULES:
            edges[m].add(parent)
    out = {}
    for m in MODULES:
        seen, todo, found = {m}, [m], set()
        while todo:
            for t in edges.get(todo.pop(), ()):
                if t in HEAVY:
                    found.add(t)
                elif t in MODULES and t not in seen:
                    seen.add(t)
                    todo.append(t)
        out[m] = found
    return out


def test_every_module_has_a_layer():
    missing = []
    for m in MODULES:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert missing == [], f"add these modules to a layer in LAYERS (and docs/design.md): {missing}"


def test_no_import_cycles():
    assert _cycles() == []


def test_imports_flow_down_and_siblings_are_independent():
    bad = []
    for i in _internal():
        (lm, em), (lt, et) = layer_of(i.module), layer_of(i.target)
        if lt > lm:
            bad.append(f"{i.module}:{i.line} imports {i.target} (layer {lt} above {lm}: upward)")
        elif lt == lm and em != et and not (i.module.startswith(et + ".") or i.target.startswith(em + ".")):
            bad.append(f"{i.module}:{i.line} imports {i.target} (sibling packages {em} and {et} of layer {lm})")
    assert bad == []


def test_no_library_module_imports_a_pass():
    """Only the entry points import tfcompile.passes (and so fill the pass registry)."""
    bad = [f"{i.module}:{i.line}" for i in _internal() if i.target.startswith("tfcompile.passes")
           and not i.module.startswith(("tfcompile.passes", "tfcompile.api", "tfcompile.cli"))]
    assert bad == []


def _pass_of(module: str) -> str | None:
    """The pass a module of tfcompile.passes belongs to: its first name under tfcompile.passes
    (tfcompile.passes.quantize.gptq -> "quantize"); None for the package itself and for
    tfcompile.passes.builtin, the one list that imports every pass to register it."""
    parts = module.split(".")
    if parts[:2] != ["tfcompile", "passes"] or len(parts) < 3 or parts[2] == "builtin":
        return None
    return parts[2]


def test_no_pass_imports_another_pass():
    """Passes exchange facts through the context and registries (tfcompile/ir.py LAYER_SOLVERS, the
    layout plan, tfcompile/manifest_doc.py), never by importing one another (issue 25)."""
    bad = []
    for i in _internal():
        mine, theirs = _pass_of(i.module), _pass_of(i.target)
        if mine is not None and theirs is not None and mine != theirs:
            bad.append(f"{i.module}:{i.line} imports {i.target} (pass {mine} -> pass {theirs})")
    assert bad == []




def test_no_pass_reads_another_pass_s_config():
    """A pass learns what another will do from the typed facts the recipe's passes promise
    (tfcompile/pipeline/intents.py `recipe_intent`), never by reading its config
    (`recipe.config("quantize")`) or looking for its name in the schedule (`"distill" in
    recipe.names()`) (issue 25 item 3). A pass's `implies` (the settings it asks of the passes it
    schedules, declared at registration) is how it may name another."""
    import tfcompile.api  # noqa: F401  (registers the passes)
    from tfcompile.pipeline.passes import REGISTRY

    found = set()
    for module, path in MODULES.items():
        mine = _pass_of(module)
        if mine is None:
            continue
        for name, line in _passes_read(path.read_text(), REGISTRY):
            if REGISTRY[name] is not REGISTRY.get(mine):
                found.add((module, name, line))
    assert sorted(f"{m}:{line} reads pass {p!r}" for m, p, line in found) == []


def _passes_read(source: str, registry) -> list[tuple[str, int]]:
    """(pass name, line) of every `x.config("name")`, `get_pass("name")` and `"name" in x` of a
    registered pass in `source`, outside a function named `_implies`."""
    tree = ast.parse(source)
    implies = {id(x) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_implies"
               for x in ast.walk(f)}
    out = []
    for n in ast.walk(tree):
        if id(n) in implies:
            continue
        named = []
        if isinstance(n, ast.Call) and (isinstance(n.func, ast.Attribute) and n.func.attr == "config"
                                        or isinstance(n.func, ast.Name) and n.func.id == "get_pass"):
            named = [a.value for a in n.args if isinstance(a, ast.Constant)]
        elif isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops):
            named = [n.left.value] if isinstance(n.left, ast.Constant) else []
        out += [(name, n.lineno) for name in named if name in registry]
    return out


def test_the_estimate_reads_no_pass_by_name():
    """`plan --estimate` (tfcompile/estimate/) learns what the passes will do from the facts they
    promise (`recipe_intent(recipe, CalibrationRun)`, `LayerSolve`, `ShardSize`, ...) and what an
    algorithm's solves cost from its registration, never by a pass's name: no `recipe.config("x")`,
    `get_pass("x")` or `"x" in recipe.names()` (issue 25: the core names no pass)."""
    import tfcompile.api  # noqa: F401  (registers the passes)
    from tfcompile.pipeline.passes import REGISTRY

    found = [f"{path.name}:{line} names pass {name!r}" for path in sorted((ROOT / "tfcompile" / "estimate").glob("*.py"))
             for name, line in _passes_read(path.read_text(), REGISTRY)]
    assert found == []
    assert sorted(_passes_read('c = recipe.config("calibrate") if "pack" in names else get_pass("select")\n',
                               REGISTRY)) == [("calibrate", 1), ("pack", 1), ("select", 1)]  # the check can fail


# lazy imports of light modules that are lazy for another reason than weight
LIGHT_BUT_LAZY = {
    # tfcompile/cli/main.py stays stdlib-only so that `entry` takes the signals before anything
    # else loads (issue 24 case 8); click and the group come after
    ("tfcompile.cli.main", "tfcompile.cli.app"),
}


def test_imports_inside_functions_are_heavy_and_say_why():
    heavy = _heavy_closure()
    bad = []
    for i in IMPORTS:
        if not i.in_function or ((i.module, i.target) in LIGHT_BUT_LAZY and i.reason):
            continue
        if i.target in MODULES:
            ok, why = bool(heavy[i.target]), f"{i.target} reaches no heavy package at import"
        else:
            ok, why = i.target in HEAVY, f"{i.target} is not a heavy dependency"
        if not ok:
            bad.append(f"{i.module}:{i.line}: {why}: import it at the top of the module")
        elif not i.reason:
            bad.append(f"{i.module}:{i.line}: an import inside a function needs a `# lazy: <reason>` comment")
    assert bad == []


def test_design_doc_shows_these_layers():
    """docs/design.md "Layers" lists the same layers (names in backticks, one row per layer)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Layers"):]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].isdigit():
            names = [n for n in cells[2].split("`")[1::2]]
            rows[int(cells[1])] = sorted(n if n.startswith("tfcompile") else f"tfcompile.{n}" for n in names)
    assert rows == {i: sorted(entries) for i, entries in enumerate(LAYERS)}


@pytest.mark.parametrize("module,target,ok", [
    ("tfcompile.passes.pack", "tfcompile.ir", True),
    ("tfcompile.ir", "tfcompile.passes.pack", False),
    ("tfcompile.layout.view", "tfcompile.tune.shapes", False),  # siblings
    ("tfcompile.cli.main", "tfcompile.passes.builtin", True),
])
def test_the_rule_itself(module, target, ok):
    """The layer rule on known cases (so a broken LAYERS table cannot pass silently)."""
    (lm, em), (lt, et) = layer_of(module), layer_of(target)
    assert (lt < lm or (lt == lm and em == et)) == ok


# What a pass drives, loaded only when the pass runs (docs/design.md "Pass modules"): declaring
# every pass (tfcompile.passes.builtin, which every run imports) must not import any of these.
PASS_IMPLEMENTATIONS = ("tfcompile.tune.emit", "tfcompile.tune.cutlass_emit", "tfcompile.tune.compile",
                        "tfcompile.kernels.cutlass.build", "tfcompile.distill.run", "tfcompile.mixed.fisher",
                        "tfcompile.mixed.sensitivity", "tfcompile.evaluate.runner", "tfcompile.calibration.forward",
                        "tfcompile.calibration.sequential", "tfcompile.report.page", "tfcompile.onnx_export.export",
                        "triton", "onnx")


def test_declaring_the_passes_loads_no_implementation():
    import json
    import subprocess
    import sys

    code = ("import json, sys; import tfcompile.passes.builtin as b; from tfcompile.pipeline.passes import REGISTRY; "
            f"print(json.dumps({{'loaded': sorted(m for m in {PASS_IMPLEMENTATIONS!r} if m in sys.modules), "
            "'schedule': list(b.STANDARD), 'registered': sorted(REGISTRY)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.splitlines()[-1])
    assert doc["loaded"] == []
    assert set(doc["schedule"]) <= set(doc["registered"])  # every pass still declared


def test_the_pipeline_core_names_no_pass():
    """tfcompile/pipeline/ (the manager, the context, the recipe, ranks, the distributed run) asks
    the passes' declarations (requires, produces, ranks, config fields), never a pass by name; a
    pass name in its code, outside docstrings, fails (issue 25 item 3)."""
    import tfcompile.api  # noqa: F401  (registers the passes)
    from tfcompile.pipeline.passes import REGISTRY

    names, bad = set(REGISTRY), []
    for path in sorted((ROOT / "tfcompile" / "pipeline").glob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        bad += [f"{path.name}:{n.lineno} {n.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and n.value in names and id(n) not in docs]
    assert names and bad == []
