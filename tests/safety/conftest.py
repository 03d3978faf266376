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
