"""No start-up tax: `tfcompile --help`, each command's --help and its usage errors import no heavy
package (torch, transformers, onnx, triton, safetensors' torch side); the commands load them when they
run. Timing is bench/startup.py's (docs/performance.md); these tests check what can fail without a clock.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tfcompile.cli.lazy import COMMANDS
from tfcompile.cli.app import cli

HEAVY = ("torch", "transformers", "onnx", "onnxruntime", "triton", "safetensors.torch", "datasets", "modelopt")

# Run in a fresh interpreter: every command's --help and a usage error (a missing argument, or an
# unknown option for a command whose arguments are all optional), then the heavy modules loaded.
PROBE = """
import contextlib, io, json, sys
from tfcompile.cli.lazy import COMMANDS
from tfcompile.cli.main import main
codes = {}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes["--help"] = main(["--help"])
    for name in COMMANDS:
        codes[name + " --help"] = main([name, "--help"])
        codes[name + " --no-such-option"] = main([name, "--no-such-option"])
        codes[name] = main([name]) if name not in ("plan",) else 2
    # user errors found from the arguments alone (exit 1), before any heavy import
    codes["unknown format"] = main(["quantize", "examples/demo-lm", "-o", "/nonexistent/out", "--format", "nvfp4x"])
    codes["plan unknown format"] = main(["plan", "--format", "nvfp4x"])
    codes["verify a non-artifact"] = main(["verify", "/nonexistent"])
    codes["inspect a non-artifact"] = main(["inspect", "/nonexistent"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY_TOP or m in HEAVY)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def _probe(code: str) -> dict:
    prelude = f"HEAVY = {HEAVY!r}\nHEAVY_TOP = {tuple(h for h in HEAVY if '.' not in h)!r}\n"
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])  # the repo root: examples/demo-lm
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_import_of_the_cli_loads_no_heavy_package():
    doc = _probe("import tfcompile.cli.main, json, sys\n"
                 "print(json.dumps({'heavy': sorted(m for m in sys.modules if m.split('.')[0] in HEAVY_TOP "
                 "or m in HEAVY)}))")
    assert doc["heavy"] == []


def test_help_and_usage_errors_load_no_heavy_package():
    doc = _probe(PROBE)
    assert doc["heavy"] == [], "a command's --help or usage error imported these"
    codes = doc["codes"]
    assert codes["--help"] == 0
    for name in COMMANDS:
        assert codes[f"{name} --help"] == 0, name
        assert codes[f"{name} --no-such-option"] == 2, name  # click's usage error: exit 2
    # commands with a required argument fail as usage errors too (plan's MODEL is optional)
    assert {n: codes[n] for n in COMMANDS} == {n: 2 for n in COMMANDS}
    assert [codes[k] for k in ("unknown format", "plan unknown format", "verify a non-artifact",
                               "inspect a non-artifact")] == [1, 1, 1, 1]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_table_entry_is_the_commands_own(name):
    """The lazy table's short help and name are the command's (so `--help` cannot drift from it)."""
    entry = COMMANDS[name]
    command = getattr(importlib.import_module(entry.module), entry.attr)
    assert isinstance(command, click.Command)
    assert command.name == name
    assert entry.short_help == command.get_short_help_str(limit=10**6)


@pytest.mark.parametrize("width", [50, 80, 120])
def test_group_help_equals_an_eager_groups(width):
    """`tfcompile --help` from the table equals click's own listing of the imported commands."""
    commands = [getattr(importlib.import_module(e.module), e.attr) for e in COMMANDS.values()]
    eager = click.Group(name="tfcompile", commands=commands, params=cli.params, help=cli.help)
    fresh = type(cli)(name="tfcompile", params=cli.params, help=cli.help)  # nothing imported yet
    texts = [g.get_help(click.Context(g, info_name="tfcompile", terminal_width=width, max_content_width=width))
             for g in (eager, fresh)]
    assert texts[0] == texts[1]
    assert all(name in texts[1] for name in COMMANDS)


def test_unknown_command_is_a_usage_error(capsys):
    from tfcompile.cli.main import main

    assert main(["quantise"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'quantise'" in err and "hint: run `tfcompile --help`" in err


def _tiny_llama(path, **config) -> None:
    """A 2-layer Llama checkpoint (random bf16 weights), built here from the shapes transformers gives."""
    from safetensors.torch import save_file

    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, **config}
    transformers = pytest.importorskip("transformers")
    import torch

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(cfg))
    path.mkdir()
    save_file({n: torch.randn(t.shape).to(torch.bfloat16) for n, t in model.state_dict().items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))


CHECK = """
import json, sys
from tfcompile.checkpoint_check import check_checkpoint, checkpoint_tensors
from tfcompile.io.checkpoint import open_checkpoint
ckpt = open_checkpoint(sys.argv[1])
try:
    verdict = check_checkpoint(ckpt.config, checkpoint_tensors(ckpt), where=str(ckpt.path))
except Exception as e:
    verdict = type(e).__name__
modeling = sorted(m for m in sys.modules if m.startswith("transformers.models.") and ".modeling_" in m)
print(json.dumps({"verdict": verdict, "modeling": modeling, "transformers": "transformers" in sys.modules}))
"""


def _check_in_fresh_process(path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHECK, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_checkpoint_check_of_a_dense_llama_imports_no_modeling_module(tmp_path):
    _tiny_llama(tmp_path / "m")
    doc = _check_in_fresh_process(tmp_path / "m")
    assert doc == {"verdict": None, "modeling": [], "transformers": False}


def test_a_mismatch_is_still_named_by_transformers_loader(tmp_path):
    """The fast path only accepts; a checkpoint off the table goes to the meta model (and is refused)."""
    _tiny_llama(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    doc = _check_in_fresh_process(tmp_path / "m")
    assert doc["verdict"] == "CheckpointError"
    assert "transformers.models.llama.modeling_llama" in doc["modeling"]


def test_every_command_module_is_in_the_lazy_table():
    """A command added under tfcompile/cli/ without its COMMANDS entry would never be listed or
    run: every module-level `@click.command` function there is an entry (module and attribute)."""
    import re

    from tfcompile.cli.lazy import COMMANDS

    cli_dir = Path(__file__).resolve().parents[2] / "tfcompile" / "cli"
    found = set()
    for path in sorted(cli_dir.glob("*.py")):
        src = path.read_text()
        for m in re.finditer(r"^@click\.command\(", src, re.M):  # module level: column 0
            found.add((f"tfcompile.cli.{path.stem}", re.compile(r"^def (\w+)\(", re.M).search(src, m.end()).group(1)))
    assert found and found == {(c.module, c.attr) for c in COMMANDS.values()}


def test_only_a_one_shot_process_freezes_its_imports():
    """`entry` (the console script) loads a command's heavy imports with the collector off, then
    freezes them (tfcompile/cli/main.py `importing`), so neither later collections nor interpreter
    shutdown walk them; the collector is on again after. `main`, which the tests call many times in
    one interpreter, never freezes (a frozen object is never freed)."""
    code = ("import gc, json, tfcompile.cli.main as m\n"
            "with m.importing(): import tfcompile.cli.quantize\n"
            "in_process = gc.get_freeze_count()\n"
            "m._ONE_SHOT = True\n"
            "with m.importing(): off = gc.isenabled(); import tfcompile.api\n"
            "print(json.dumps({'in_process': in_process, 'one_shot': gc.get_freeze_count(), 'off': off, "
            "'after': gc.isenabled()}))")
    doc = _probe(code)
    assert doc["in_process"] == 0 and doc["one_shot"] > 1000
    assert doc["off"] is False and doc["after"] is True
