"""The bench suite's runner (issue 25 item 6).

    python -m bench list [GROUP]          every bench: group, name, what it measures, the docs it writes
    python -m bench run NAME [ARGS...]    run one, as `python bench/NAME.py ARGS...` (its --help lists ARGS),
                                          a study as `python -m bench.studies.NAME ARGS...`

Groups (`SUITE`): `performance` (speed and memory against a baseline in the same run),
`accuracy` (KL, perplexity, acceptance on held-out text), `peers` (tfcompile beside
llm-compressor, modelopt, auto-round, each in its own venv), `studies` (investigations whose
conclusions are in docs/: rerun to check them, not part of a release's figures; all in
bench/studies/), `lib` (helpers and the peers' drivers: not run on their own). A bench
runs as its own script, so the folder it lives in is the first entry of its sys.path and the
benches import one another by name (`from common import ...`); a study in bench/studies/ runs as a
module of this package and imports the helpers as `bench.common`, `bench.heldout`.
tests/test_bench_suite.py checks that no bench's name is also an installed package's (it would
shadow it), that `SUITE` lists every script once, and that each study is where its group says.

Run it from the repository root (`python -m bench` finds the package there). Standard library only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUDIES = HERE / "studies"
GROUPS = ("performance", "accuracy", "peers", "studies", "lib")
# name -> (group, the docs file whose sections it rewrites with --write-docs, or "")
SUITE: dict[str, tuple[str, str]] = {
    "formats": ("performance", "performance.md"),
    "quantize": ("performance", "performance.md"),
    "startup": ("performance", "performance.md"),
    "calibrate": ("performance", "performance.md"),
    "calib_default": ("performance", "performance.md"),
    "dist": ("performance", "performance.md"),
    "distill_sharding": ("performance", "performance.md"),
    "estimate": ("performance", "performance.md"),
    "eval_layers": ("performance", "performance.md"),
    "gpu": ("performance", "performance.md"),
    "gpu_kernels": ("performance", "performance.md"),
    "artifact_hashes": ("performance", ""),  # the byte-identity gate (tests/test_artifact_hashes.py: a subset)
    "accuracy": ("accuracy", "accuracy.md"),
    "acc_smollm2": ("accuracy", "accuracy.md"),
    "acc_demo_methods": ("accuracy", "accuracy.md"),
    "acc_distill": ("accuracy", "accuracy.md"),
    "acc_distill_smollm2": ("accuracy", "accuracy.md"),
    "acc_kv": ("accuracy", "accuracy.md"),
    "acc_mixed": ("accuracy", "accuracy.md"),
    "acc_observers": ("accuracy", "accuracy.md"),
    "acc_defaults": ("accuracy", "accuracy.md"),
    "minilm": ("accuracy", "accuracy.md"),
    "families": ("accuracy", "models.md"),
    "draft": ("accuracy", "accuracy.md"),
    "mtp": ("accuracy", "accuracy.md"),
    "peers": ("peers", "accuracy.md"),
    "calib_modelopt": ("peers", "performance.md"),
    "acc_autoround": ("peers", "accuracy.md"),
    "acc_gptq_spread": ("studies", "accuracy.md"),
    "acc_rtn_spread": ("studies", "accuracy.md"),
    "acc_rotation": ("studies", "accuracy.md"),
    "fp4_hadamard": ("studies", "accuracy.md"),
    "online_hadamard_artifacts": ("studies", "accuracy.md"),
    "fp8_rounding": ("studies", "accuracy.md"),
    "draft_step": ("studies", "performance.md"),
    "draft_probe": ("studies", "accuracy.md"),
    "draft_widen_vocab": ("studies", "accuracy.md"),
    "distill_other_text": ("studies", "accuracy.md"),
    "draft_vllm": ("peers", "accuracy.md"),
    "signround_step": ("studies", "performance.md"),
    "common": ("lib", ""),
    "heldout": ("lib", ""),
    "peers_llmc": ("lib", ""),  # llm-compressor's side, in its venv (peers.py, acc_defaults.py, startup.py)
    "peers_autoround": ("lib", ""),  # auto-round's side, in its venv (acc_autoround.py)
}


def scripts() -> list[str]:
    """Every bench script beside this runner and in studies/."""
    return sorted(p.stem for folder in (HERE, STUDIES) for p in folder.glob("*.py") if not p.stem.startswith("__"))


def path(name: str) -> Path:
    """Where bench `name` lives: bench/NAME.py, or bench/studies/NAME.py."""
    return STUDIES / f"{name}.py" if (STUDIES / f"{name}.py").is_file() else HERE / f"{name}.py"


def summary(name: str) -> str:
    """The first line of a script's docstring, read without importing it."""
    doc = ast.get_docstring(ast.parse(path(name).read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def list_benches(group: str | None) -> int:
    for name in sorted(SUITE, key=lambda n: (GROUPS.index(SUITE[n][0]), n)):
        g, docs = SUITE[name]
        if group is None or g == group:
            print(f"{g:<12} {name:<18} {summary(name)}" + (f"  [docs/{docs}]" if docs else ""))
    return 0


def run(name: str, args: list[str]) -> int:
    if name not in SUITE:
        print(f"error: no bench named {name!r}\nhint: `python -m bench list` names them", file=sys.stderr)
        return 2
    if SUITE[name][0] == "lib":
        print(f"error: {name} is a helper, not a bench\nhint: `python -m bench list` names the benches",
              file=sys.stderr)
        return 2
    if path(name).parent == STUDIES:  # a module of this package (bench.common, bench.heldout)
        return subprocess.run([sys.executable, "-m", f"bench.studies.{name}", *args], cwd=HERE.parent).returncode
    return subprocess.run([sys.executable, str(path(name)), *args]).returncode


def main(argv: list[str]) -> int:
    usage = "usage: python -m bench list [GROUP] | python -m bench run NAME [ARGS...]"
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() if argv else usage)
        return 0 if argv else 2
    if argv[0] == "list" and len(argv) <= 2 and (len(argv) == 1 or argv[1] in GROUPS):
        return list_benches(argv[1] if len(argv) == 2 else None)
    if argv[0] == "run" and len(argv) >= 2:
        return run(argv[1], argv[2:])
    print(f"{usage}\nhint: groups are {', '.join(GROUPS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
