"""The CLI's choices are the registries' names (issue 25 item 5): an option whose choices come
from a registry that loads without torch takes them from it (tfcompile/cli/flags.py: --kv-cache
from tfcompile.schemes KV_FORMATS, --layout and --kv-layout from tfcompile/layout/engines.py,
--algorithm from passes/quantize/__init__.py ALGORITHM_HELP, which must name what is registered);
the others, whose registries are filled by modules that import torch (the algorithms, observers,
distillation settings, --cutlass modes), must list exactly the registered names, so a new
algorithm or observer is offered by the CLI or this test fails."""

from __future__ import annotations

import click
import pytest

import tfcompile.api  # noqa: F401  (registers the passes, and with them the algorithms)
from tfcompile.calibration.observers import OBSERVERS
from tfcompile.cli.distill import distill
from tfcompile.cli.quantize import quantize
from tfcompile.distill import config as distill_config
from tfcompile.ir import ALGORITHMS
from tfcompile.layout.engines import ENGINES as LAYOUT_ENGINES, KV_LAYOUTS
from tfcompile.passes.emit_cutlass import COMPILE_MODES
from tfcompile.passes.quantize import ALGORITHM_HELP
from tfcompile.schemes import KV_FORMATS


def _choices(command: click.Command, name: str) -> list[str]:
    (param,) = [p for p in command.params if p.name == name]
    assert isinstance(param.type, click.Choice), f"--{name} has no choices"
    return list(param.type.choices)


@pytest.mark.parametrize("command, option, registry", [
    (quantize, "algorithm", ALGORITHMS),
    (quantize, "algorithm", ALGORITHM_HELP),
    (quantize, "observer", OBSERVERS),
    (quantize, "kv_cache", KV_FORMATS),
    (quantize, "layout_target", LAYOUT_ENGINES),
    (quantize, "layout_kv_layout", KV_LAYOUTS),
    (quantize, "emit_cutlass", COMPILE_MODES),
    (distill, "train_", distill_config.TRAIN),
    (distill, "mode", distill_config.MODES),
    (distill, "teacher", distill_config.TEACHERS),
    (distill, "sharding", distill_config.SHARDINGS),
])
def test_cli_choices_are_the_registered_names(command, option, registry):
    assert sorted(_choices(command, option)) == sorted(registry)


def _settings():
    """(command, click parameter, target) for every flag that sets a pass field (cli/flags.py)."""
    from tfcompile.cli import flags

    targets = {o.dest: o.target for g in (flags.load_options, flags.recipe_options, flags.eval_options,
                                          flags.emit_options, flags.layout_options, flags.distill_options)
               for o in g.options if hasattr(o, "target")}
    return [(c, p, targets[p.name]) for c in (quantize, distill) for p in c.params if p.name in targets]


def test_every_flag_targets_a_field_of_a_registered_pass():
    """A flag's target is its only link to the config: it must name a pass and a field that exist,
    and a typed flag's type must be the field's (a typo fails here, not at a user's run)."""
    import dataclasses
    import typing

    from tfcompile.pipeline.passes import get_pass

    seen = set()
    for command, param, target in _settings():
        name, _, field = target.partition(".")
        config = get_pass(name).config
        seen.add(target)
        if not field:
            continue
        fields = {f.name: f for f in dataclasses.fields(config)}
        assert field in fields, f"--{param.name}: {target} is not a field of {config.__name__}"
        hint = typing.get_type_hints(config)[field]
        py = {"integer": int, "float": float}.get(param.type.name)
        if py is not None and not param.multiple:
            assert py in (typing.get_args(hint) or (hint,)), (target, param.type.name, hint)
    assert len(seen) >= 35, sorted(seen)  # the scan found the flags


def test_stated_defaults_are_the_configs():
    """A help text that states a default states the target field's (the CLI cannot import the
    configs: they load torch, which --help must not)."""
    import dataclasses
    import re

    from tfcompile.pipeline.passes import get_pass

    checked = 0
    for command, param, target in _settings():
        stated = re.search(r"\(default ([0-9.]+)", param.help or "")
        if not stated:
            continue
        name, _, field = target.partition(".")
        default = {f.name: f.default for f in dataclasses.fields(get_pass(name).config)}[field]
        assert float(stated.group(1)) == float(default), (target, stated.group(1), default)
        checked += 1
    assert checked >= 9
