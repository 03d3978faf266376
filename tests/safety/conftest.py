"""Fixtures for the safety tests: signing keys, and `paused_run` (safety_helpers.Paused)."""

from __future__ import annotations

import pytest

from safety_helpers import Paused


@pytest.fixture(scope="session")
def ed25519_keys(tmp_path_factory):
    """(private PEM path, public PEM path, second public PEM path) made with `cryptography`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = tmp_path_factory.mktemp("keys")
    paths = []
    for name in ("release", "other"):
        key = Ed25519PrivateKey.generate()
        priv = d / f"{name}.pem"
        priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        pub = d / f"{name}.pub"
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        paths.append((priv, pub))
    return paths[0][0], paths[0][1], paths[1][1]


@pytest.fixture
def paused_run(tmp_path):
    runs: list[Paused] = []

    def start(target: str, *args, seconds: float = 60, env: dict | None = None) -> Paused:
        p = Paused(target, list(args), tmp_path, seconds, env)
        runs.append(p)
        return p

    yield start
    for p in runs:
        p.kill()


@pytest.fixture(scope="module")
def fuzz_dirs(tmp_path_factory):
    """(cases, tmpdir) for a fuzz module: `cases` holds each example's copies; TMPDIR (the
    environment and tempfile's cached default) is `tmpdir`, kept apart so a test can check that
    a run left nothing in it."""
    import os
    import tempfile

    cases, tmpdir = tmp_path_factory.mktemp("cases"), tmp_path_factory.mktemp("tmpdir")
    old_env, old_default = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(tmpdir), str(tmpdir)
    yield cases, tmpdir
    tempfile.tempdir = old_default
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env
