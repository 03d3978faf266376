"""The types of the optional manifest fields that `report`, `inspect` and `verify` read.

check_schema (integrity.py) checks what every tool needs; this module checks the rest, the
fields that reach a page or a table (issue 24 case 8: a number for `source.name`, a string for
`summary.median_sqnr_db`, an `eval` without `metrics`, a number for `source.hub.repo_id` ended
in a traceback). A wrong type is a VerifyError naming the field, exit 1.

A spec is a tuple of (path, kind). A path is dotted keys, `[]` for every item of a list and
`{}` for every value of an object (`eval.gates[].metric`, `source.files{}`). A kind is one of
str, num (int or float, not bool), bool, dict, list, scalar (str, num or bool: shown with
str()); `?` after it allows null; `!` makes the key required wherever its parent is present.
A field that is absent is not checked (older artifacts lack some).
"""

from __future__ import annotations

from typing import Any, Iterator

from tfcompile.errors import VerifyError

_KINDS = {
    "str": lambda v: isinstance(v, str),
    "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "scalar": lambda v: isinstance(v, (str, int, float, bool)),
}
_WORDS = {"str": "a string", "num": "a number", "bool": "true or false", "dict": "an object", "list": "a list",
          "scalar": "a string or number"}

# `eval` in the manifest and `report --eval FILE` documents (tfcompile eval --json)
EVAL = (
    ("metrics", "dict!"), *((f"metrics.{k}", "num?!") for k in ("perplexity", "reference_perplexity",
                                                               "kl_mean", "top1_agreement")),
    ("metrics.ppl_increase", "num?"), ("metrics.kl_max", "num?"),
    ("metrics.tokens", "scalar?!"), ("ok", "bool?"), ("text", "dict"), ("text.source", "scalar?"),
    ("text.sequences", "scalar?"), ("gates", "list"), ("gates[]", "dict"), ("gates[].gate", "scalar!"),
    ("gates[].metric", "str!"), ("gates[].value", "num?!"), ("gates[].threshold", "num?!"), ("gates[].ok", "bool!"),
    ("layers", "list?"), ("layers[]", "dict"), ("layers[].module", "str!"), ("layers[].sqnr_db", "num?"),
    ("layers[].e2e_sqnr_db", "num?"), ("layer_kl", "list?"), ("layer_kl[]", "dict"), ("layer_kl[].layer", "num!"),
    ("layer_kl[].kl_mean", "num!"), ("layer_kl_positions", "num?"), ("kv_cache", "dict?"), ("kv_cache.dtype", "scalar?"),
    ("kv_cache.strategy", "str?!"), ("kv_cache.emulated", "bool!"), ("kv_cache.modules", "scalar?!"),
    ("kv_cache.mode", "scalar?!"),
)
MANIFEST = (
    ("tool", "dict!"), ("tool.version", "scalar!"),
    ("source", "dict"), ("source.name", "str?"), ("source.architecture", "scalar?"), ("source.dtype", "scalar?"),
    ("source.files", "dict"), ("source.files{}", "str"),
    ("source.hub", "dict?"), ("source.hub.repo_id", "str!"), ("source.hub.commit", "str!"),
    ("dependencies", "dict"), ("dependencies{}", "scalar?"),
    *((f"summary.{k}", "num?!") for k in ("quantized_linears", "bytes_in", "bytes_out", "compression_ratio",
                                           "worst_sqnr_db")), ("summary.median_sqnr_db", "num?"),
    ("scheme.kv_cache", "dict?"), ("scheme.kv_cache.dtype", "str!"), ("scheme.kv_cache.strategy", "str?"),
    ("scheme.activations", "str?"), ("scheme.online_transform", "dict"), ("scheme.online_transform.type", "str!"),
    ("scheme.online_transform.order", "num!"),
    ("layout", "dict?"), ("layout.spec", "dict?"), ("calibration", "dict?"),
    ("layers[].algorithm", "str"),
    ("cutlass", "dict?"), ("cutlass.targets", "dict"), ("cutlass.targets{}", "dict"),
    ("cutlass.targets{}.sources", "list"), ("cutlass.targets{}.note", "scalar"),
    ("eval", "dict?"), *((f"eval.{p}", k) for p, k in EVAL),
)
# tfcompile/triton/index.json, as the report's kernel table reads it
TRITON_INDEX = (
    ("targets", "dict"), ("targets{}", "dict"), ("targets{}.gemm", "list"), ("targets{}.gemm[]", "str"),
    ("targets{}.act_quant", "list"), ("targets{}.act_quant[]", "str"), ("targets{}.note", "str"),
    ("kernels", "list"), ("kernels[]", "dict"),
)


def check_fields(doc: Any, spec: tuple, where: str, hint: str, error: type = VerifyError) -> None:
    """`error` naming `where` and the first field of `doc` whose value is not of its kind."""
    for path, kind in spec:
        base = kind.rstrip("?!")
        nullable, required = "?" in kind, kind.endswith("!")
        for shown, value in _at(doc, _split(path), "", required):
            if value is _MISSING:
                raise error(f"{where}: field {shown} is missing", hint=hint)
            if not (value is None and nullable) and not _KINDS[base](value):
                text = repr(value)
                text = text if len(text) <= 40 else text[:37] + "..."
                raise error(f"{where}: field {shown} = {text} is not {_WORDS[base]}", hint=hint)


_MISSING = object()


def _split(path: str) -> list[str]:
    """'eval.gates[].metric' -> ['eval', 'gates', '[]', 'metric']."""
    out = []
    for part in path.split("."):
        suffix = part[-2:] if part.endswith(("[]", "{}")) else ""
        out += [part[:len(part) - len(suffix)]] + ([suffix] if suffix else [])
    return out


def _at(node: Any, parts: list[str], shown: str, required: bool) -> Iterator[tuple[str, Any]]:
    """(the field's name, its value) for every place `parts` reaches in `node`; _MISSING when the
    last key is required and absent from a parent that is there."""
    if not parts:
        yield shown, node
        return
    head, rest = parts[0], parts[1:]
    if head == "[]":
        for i, item in enumerate(node if isinstance(node, list) else []):
            yield from _at(item, rest, f"{shown}[{i}]", required)
    elif head == "{}":
        for key, item in (node.items() if isinstance(node, dict) else ()):
            yield from _at(item, rest, f"{shown}.{key}" if shown else str(key), required)
    elif isinstance(node, dict):
        name = f"{shown}.{head}" if shown else head
        if head in node:
            yield from _at(node[head], rest, name, required)
        elif required and not rest:
            yield name, _MISSING


__all__ = ["EVAL", "MANIFEST", "TRITON_INDEX", "check_fields"]
