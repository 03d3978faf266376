"""`tfcompile sign` and the safety options other commands share (`--sign`, `--public-key`,
`--allow-unknown-architecture`). What is signed and why: tfcompile/artifact/signing.py."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from tfcompile.cli.output import emit_json, stderr_console


def sign_option(f):
    """`--sign KEY` (quantize, distill): sign the manifest before the artifact is published."""
    return click.option("--sign", "sign_key", type=click.Path(path_type=Path), metavar="KEY",
                        help="Sign the artifact's manifest with this ed25519 private key (PEM or OpenSSH; "
                        "passphrase from TFCOMPILE_KEY_PASSPHRASE). The key never enters the artifact.")(f)


def unknown_architecture_option(f):
    """`--allow-unknown-architecture` (quantize, distill): sets load.allow_unknown_architecture."""
    return click.option("--allow-unknown-architecture", "allow_unknown_architecture", is_flag=True, default=None,
                        help="Quantize an architecture transformers does not have, by tensor names alone: "
                        "nothing checks that the checkpoint is complete (docs/cli.md \"Safety\").")(f)


def load_overrides(allow_unknown_architecture: bool | None) -> dict | None:
    """The `load` pass settings the options above give (None: none)."""
    return {"allow_unknown_architecture": True} if allow_unknown_architecture else None


def public_key_option(f):
    """`--public-key PUB` (verify): check the manifest's signature with it."""
    return click.option("--public-key", "public_key", type=click.Path(path_type=Path), metavar="PUB",
                        help="Check the manifest's ed25519 signature with this public key (PEM or OpenSSH "
                        "line); a missing or wrong signature fails.")(f)


@click.command("sign")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--key", "key", required=True, type=click.Path(path_type=Path), metavar="KEY",
              help="ed25519 private key (PEM or OpenSSH; passphrase from TFCOMPILE_KEY_PASSPHRASE).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def sign_cmd(artifact, key, as_json):
    """Sign ARTIFACT's manifest (writes ARTIFACT/tfcompile/manifest.sig).

    The artifact is checked first (manifest integrity, paths, no unlisted files, checksums):
    a signature vouches for what is there, so a damaged artifact is refused (exit 1)."""
    from tfcompile.artifact.signing import SIGNATURE, key_id, load_private_key, sign_artifact
    from tfcompile.artifact.verify import VerifyReport, check_files, load_manifest
    from tfcompile.errors import VerifyError

    private = load_private_key(key)
    doc = load_manifest(artifact)
    rep = VerifyReport(str(artifact))
    check_files(Path(artifact), doc, rep)
    bad = [c for c in rep.failures() if c["check"] != "signature"]
    if bad:
        raise VerifyError(f"{artifact} fails '{bad[0]['check']}': {bad[0]['detail']}; not signed",
                          hint="sign only what tfcompile built and verify passes; rebuild the artifact")
    sign_artifact(Path(artifact), private)
    kid = key_id(private.public_key())
    if as_json:
        emit_json({"ok": True, "artifact": str(artifact), "signature": SIGNATURE, "key_id": kid})
    else:
        stderr_console().print(f"signed [bold]{escape(str(artifact))}[/] (key id {kid[:16]}...): {SIGNATURE}")
