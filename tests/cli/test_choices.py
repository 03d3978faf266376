"""The CLI's choices are the registries' names (issue 25 item 5): an option whose choices come
from a registry that loads without torch takes them from it (tfcompile/cli/options.py: --kv-cache
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


# An option's help that states a default states the config field's: (command, option dest) ->
# (config class, field). The CLI cannot import the configs (they load torch, which --help must
# not), so the restated numbers are held to the dataclasses here.
def _configs():
    from tfcompile.distill.config import DistillConfig
    from tfcompile.passes.calibrate import CalibrateConfig
    from tfcompile.passes.evaluate import EvalConfig

    return {("calib_samples", quantize): (CalibrateConfig, "samples"),
            ("calib_seq_len", quantize): (CalibrateConfig, "seq_len"),
            ("calib_seed", quantize): (CalibrateConfig, "seed"),
            ("eval_tokens", quantize): (EvalConfig, "max_tokens"),
            ("steps", distill): (DistillConfig, "steps"), ("batch", distill): (DistillConfig, "batch"),
            ("grad_accum", distill): (DistillConfig, "grad_accum"),
            ("temperature", distill): (DistillConfig, "temperature"), ("seed", distill): (DistillConfig, "seed")}


def test_stated_defaults_are_the_configs():
    import dataclasses
    import re

    for (dest, command), (config, field) in _configs().items():
        (param,) = [p for p in command.params if p.name == dest]
        stated = re.search(r"\(default ([0-9.]+)", param.help or "")
        assert stated, f"--{dest}: no stated default"
        default = {f.name: f.default for f in dataclasses.fields(config)}[field]
        assert float(stated.group(1)) == float(default), (dest, stated.group(1), default)
