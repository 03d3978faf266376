"""MODEL as a Hugging Face Hub id: `tfcompile quantize HuggingFaceTB/SmolLM2-135M --revision R`.

`resolve_model(ref, revision)` returns a local checkpoint directory:

- an existing local path is used as it is (a local directory always wins over a Hub id);
- otherwise a Hub id (`ORG/NAME`) is resolved by `huggingface_hub.snapshot_download` into its
  cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), read at call
  time. With `HF_HUB_OFFLINE=1` nothing is downloaded: the revision must already be in the
  cache (`refs/<revision>` -> `snapshots/<commit>/`). The token, for gated or private
  repositories, is huggingface_hub's own (`HF_TOKEN`, or `hf auth login`): tfcompile never
  reads, prints or stores it.

Only what a checkpoint needs is fetched: config.json, *.safetensors (+ index) and the tokenizer
and generation files the artifact copies (`tfcompile.io.aux_files`); never pickles (*.bin,
*.pt) or remote code. The snapshot's files are symlinks into the repository's `blobs/`, which
`tfcompile.io.paths` allows. `hub_source(path)` recognises such a snapshot directory and gives
the manifest its provenance: the repo id and the commit sha (the directory's name), which fix
the input exactly; the requested revision (a branch or tag that may move) is not recorded.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.io.aux_files import AUX_FILE_NAMES
from tfcompile.io.paths import INDEX_FILE

# ORG/NAME as the Hub spells it: one slash, no "--" or ".." (huggingface_hub's validation rules)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ALLOW_PATTERNS = ("config.json", "*.safetensors", INDEX_FILE, *AUX_FILE_NAMES)
TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a local checkpoint directory
    repo_id: str | None = None  # the Hub id, when MODEL was one
    commit: str | None = None  # the snapshot's commit sha


def is_hub_id(ref: str) -> bool:
    return bool(HUB_ID.match(ref)) and "--" not in ref and ".." not in ref


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in TRUE


def hub_cache() -> Path:
    """The Hub cache folder huggingface_hub uses, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve_model(ref: str | os.PathLike, revision: str | None = None, *, quiet: bool = False,
                  option: str = "MODEL") -> ResolvedModel:
    """A local directory for `ref` (a path or a Hub id); see the module doc."""
    text = os.fspath(ref)
    if os.path.lexists(text) or not is_hub_id(text):
        if revision is not None:
            raise UserError(f"--revision {revision} given, but {option} {text} is not a Hugging Face Hub id",
                            hint="--revision selects a branch, tag or commit of a Hub repository ORG/NAME")
        return ResolvedModel(Path(text))
    path = _download(text, revision, quiet, option)
    return ResolvedModel(path, text, path.name if COMMIT.match(path.name) else None)


def hub_source(path: str | os.PathLike) -> dict:
    """The manifest's source entries for a Hub cache snapshot (`.../models--ORG--NAME/snapshots/
    <commit>`): {"name": "ORG/NAME", "hub": {"repo_id", "commit"}}; {} for any other directory."""
    p = Path(path).absolute()
    repo = p.parent.parent.name
    if p.parent.name != "snapshots" or not repo.startswith("models--") or not COMMIT.match(p.name):
        return {}
    repo_id = repo[len("models--"):].replace("--", "/")
    return {"name": repo_id, "hub": {"repo_id": repo_id, "commit": p.name}}


def _download(repo_id: str, revision: str | None, quiet: bool, option: str) -> Path:
    # lazy: huggingface_hub (~0.5 s to import); only when MODEL is a Hub id
    # lazy: huggingface_hub (~0.5 s to import); only when MODEL is a Hub id
    from huggingface_hub import snapshot_download
    from huggingface_hub import errors as hf

    cache, off = hub_cache(), offline()
    rev = revision or "main"
    try:
        with _bars_off(quiet):
            return Path(snapshot_download(repo_id, revision=rev, cache_dir=cache, local_files_only=off,
                                          allow_patterns=list(ALLOW_PATTERNS)))
    except hf.GatedRepoError:
        raise UserError(f"{option} {repo_id}: the Hub repository is gated and this machine has no access",
                        hint="accept its terms on huggingface.co, then set HF_TOKEN (or run `hf auth login`)") from None
    except hf.RevisionNotFoundError:
        raise UserError(f"{option} {repo_id}: revision {rev!r} does not exist on the Hub",
                        hint="pass --revision with a branch, tag or commit sha of the repository") from None
    except hf.RepositoryNotFoundError:
        raise UserError(f"{option} {repo_id} is neither a local directory nor a Hub repository you can read",
                        hint="check the path or the repo id; a private repository needs HF_TOKEN") from None
    except (hf.LocalEntryNotFoundError, FileNotFoundError, hf.HfHubHTTPError, OSError) as e:
        where = f"the Hugging Face cache {cache}"
        if off:
            raise UserError(f"{option} {repo_id} is not a local directory, and revision {rev!r} of that Hub "
                            f"repository is not in {where} (HF_HUB_OFFLINE is set)",
                            hint=f"download it once with network access (`hf download {repo_id}`), or unset "
                                 "HF_HUB_OFFLINE; HF_HOME / HF_HUB_CACHE choose the cache") from None
        raise UserError(f"{option} {repo_id} is not a local directory, and revision {rev!r} of that Hub "
                        f"repository could not be fetched into {where} ({type(e).__name__})",
                        hint="check the network (or set HF_HUB_OFFLINE=1 to use the cache only), or point "
                             f"{option} at a local checkpoint directory") from None


@contextmanager
def _bars_off(quiet: bool):
    """huggingface_hub's download bars (stderr) follow -q."""
    # lazy: huggingface_hub (~0.5 s to import); only when MODEL is a Hub id
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was = are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        yield
    finally:
        if quiet and not was:
            enable_progress_bars()


__all__ = ["ResolvedModel", "resolve_model", "hub_source", "is_hub_id", "hub_cache", "offline"]
