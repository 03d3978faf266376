"""Where each built-in pass runs under torchrun is the pass's own declaration (`ranks`), not a
list in the pipeline core (issue 25): the five passes that only write files or read the finished
artifact run on rank 0 and hand the fields they produce to the other ranks."""

from __future__ import annotations

import pytest


def test_root_passes_are_declared_by_the_passes():
    import tfcompile.api  # noqa: F401 - registers the built-in passes
    from tfcompile.pipeline.passes import REGISTRY

    root = {n for n, s in REGISTRY.items() if s.ranks == "root"}
    assert root == {"manifest", "verify", "emit", "onnx", "emit_cutlass"}
    assert all(s.ranks == "all" for n, s in REGISTRY.items() if n not in root)


def test_an_unknown_ranks_value_is_refused():
    from dataclasses import dataclass

    from tfcompile.pipeline.passes import register_pass

    @dataclass(frozen=True)
    class Cfg:
        pass

    with pytest.raises(ValueError, match="ranks must be"):
        register_pass("x-test-pass", config=Cfg, ranks="some")
