"""verify's file-tree checks: the manifest's paths, unlisted files and symlinks, checksums.

The manifest is untrusted input like a checkpoint: an entry `../../etc/passwd`
or `/etc/passwd` must never be opened (hashing it would reveal whether that
file exists and what it holds). `safe_entries` keeps only plain relative paths
(`a/b.safetensors`: no `..`, `.`, empty part, backslash, NUL, absolute path)
whose every component inside the artifact is a real directory or file, never a
symlink. Everything else is reported with the same words whether or not the
target exists. `unlisted` walks the artifact without following symlinks and
returns every file the manifest does not list (the manifest, its signature
and the HTML report `quantize --report` writes beside it excepted: none can be
in the list it hashes) and every symlink.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tfcompile.io.hashing import sha256_file

# Files verify accepts without a `files` entry: the manifest itself, its detached signature (over
# the manifest), and the human-readable report page (quantize --report), which quotes the
# manifest's digest and so is recorded beside it, in `integrity.report_sha256` (report_problem),
# not in `files`. So every file is covered by verify, and through the manifest's bytes by a signature.
REPORT_HTML = "tfcompile/report.html"
ALWAYS_ALLOWED = ("tfcompile/manifest.json", "tfcompile/manifest.sig", REPORT_HTML)


def _plain(rel: object) -> bool:
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _inside_without_links(root: Path, rel: str) -> bool:
    """Every component of `rel` under `root` exists and is not a symlink (lstat, never followed)."""
    p = root
    for part in rel.split("/"):
        p = p / part
        try:
            if stat.S_ISLNK(os.lstat(p).st_mode):
                return False
        except OSError:
            return True  # missing: reported by the checksum step as "missing", it is inside
    return True


def safe_entries(root: Path, files: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(entries safe to open, problems) for the manifest's `files`."""
    ok, bad = {}, []
    for rel, digest in sorted(files.items()):
        if not _plain(rel):
            bad.append(f"{rel!r}: points outside the artifact or is malformed")
        elif not _inside_without_links(root, rel):
            bad.append(f"{rel}: is or passes through a symlink")
        else:
            ok[rel] = digest
    return ok, bad


def unlisted(root: Path, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """(files the manifest does not list, symlinks) under `root`, as relative paths."""
    listed = set(files) | set(ALWAYS_ALLOWED)
    extra, links = [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        for name in sorted(dirnames):
            if os.path.islink(Path(dirpath) / name):
                links.append((rel_dir / name).as_posix())
        for name in sorted(filenames):
            rel = (rel_dir / name).as_posix()
            if os.path.islink(Path(dirpath) / name):
                links.append(rel)
            elif rel not in listed:
                extra.append(rel)
    return sorted(extra), sorted(links)


def report_problem(root: Path, recorded: str | None) -> str | None:
    """What is wrong with tfcompile/report.html against the sha256 the manifest records, or None
    (no report and none recorded, or a regular file with that sha256)."""
    f = root / REPORT_HTML
    if not os.path.lexists(f):
        return f"{REPORT_HTML}: missing (the manifest records one)" if recorded else None
    if not stat.S_ISREG(os.lstat(f).st_mode):
        return f"{REPORT_HTML}: not a regular file"
    if recorded is None:
        return f"{REPORT_HTML}: not recorded in the manifest (integrity.report_sha256): it was added after the build"
    if sha256_file(f) != recorded:
        return f"{REPORT_HTML}: sha256 mismatch (not the page the manifest records: it was replaced or edited)"
    return None


def checksum_problems(root: Path, entries: dict[str, str]) -> list[str]:
    bad = []
    for rel, digest in sorted(entries.items()):
        f = root / rel
        if not os.path.lexists(f):
            bad.append(f"{rel}: missing")
        elif not stat.S_ISREG(os.lstat(f).st_mode):
            bad.append(f"{rel}: not a regular file")
        elif sha256_file(f) != digest:
            bad.append(f"{rel}: sha256 mismatch")
    return bad


def listed_shards(root: Path, entries: dict[str, str], subdir: str = "") -> list[Path]:
    """The safetensors files directly in `subdir` that the manifest lists and that are regular files."""
    prefix = f"{subdir.rstrip('/')}/" if subdir else ""
    out = []
    for rel in sorted(entries):
        name = rel[len(prefix):] if rel.startswith(prefix) else None
        if name and "/" not in name and name.endswith(".safetensors"):
            f = root / rel
            if os.path.lexists(f) and stat.S_ISREG(os.lstat(f).st_mode):
                out.append(f)
    return out
