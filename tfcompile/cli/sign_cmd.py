"""`tfcompile sign`, and verify's `--public-key` (quantize and distill take `--sign` through
tfcompile/cli/flags.py). What is signed and why: tfcompile/artifact/signing.py."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from tfcompile.artifact.manifest import load_manifest
from tfcompile.artifact.signing import SIGNATURE, key_id, load_private_key, sign_artifact
from tfcompile.cli.output import emit_json, stderr_console
from tfcompile.errors import VerifyError
from tfcompile.io.out_policy import check_in_place


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
    private = load_private_key(key)
    check_in_place(artifact, SIGNATURE)  # never into a Hugging Face cache
    doc = load_manifest(artifact)
    from tfcompile.artifact.verify import VerifyReport, check_files  # lazy: verify.py imports torch

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
