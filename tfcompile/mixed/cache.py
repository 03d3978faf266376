"""Measured sensitivities, remembered across runs: a new budget needs no new measurement.

Choosing another `mixed.avg_bits` for the same model re-runs only the search, not the
(groups x formats) forwards. The key is the sha256 of everything the measurement depends on:
the source files' digests (tfcompile/io/hash_cache.py), what replaced or rotated their tensors
(the checkpoint's provenance), the groups and their members, the formats, the tokens' settings,
the MX rule and tfcompile's version. Stored as JSON in $TFCOMPILE_CACHE/mixed/<key>.json
(written atomically); a missing or unreadable entry is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from tfcompile import __version__
from tfcompile.io.hash_cache import cache_path, sha256_files_cached
from tfcompile.mixed.search import GroupCost


def key(source, plan, settings: dict) -> str:
    digests = sha256_files_cached(list(source.files))
    doc = {"files": sorted((Path(f).name, d) for f, d in digests.items()),
           "provenance": getattr(source, "provenance", None) or {},
           "groups": [[g.key, [t.module for t in g.members]] for g in plan.groups],
           "base": plan.scheme.name, "settings": settings, "version": __version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _path(k: str) -> Path:
    return cache_path().parent / "mixed" / f"{k}.json"


def load(k: str) -> tuple[list[GroupCost], dict] | None:
    try:
        doc = json.loads(_path(k).read_text())
        return [GroupCost(c["key"], c["params"], c["kl"]) for c in doc["costs"]], doc["record"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(k: str, costs: list[GroupCost], record: dict) -> None:
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mixed.")
        with os.fdopen(fd, "w") as f:
            json.dump({"costs": [{"key": c.key, "params": c.params, "kl": c.kl} for c in costs],
                       "record": record}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache we cannot write only costs time next run
