"""docs/ci.md "A complete model-release job": every `run:` step of its GitHub Actions YAML, in order,
as the runner would run it (bash -e, the job's and the step's env), on examples/demo-lm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import DEMO  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- release-job:"


def release_job() -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    block = text[text.index(MARK):].split("```yaml\n", 1)[1].split("\n```", 1)[0]
    return yaml.safe_load(block)["jobs"]["release"]


def _keys(work: Path) -> str:
    key = Ed25519PrivateKey.generate()
    (work / "keys").mkdir()
    (work / "keys" / "release.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def test_install_step_installs_the_eval_extra():
    [install] = [s for s in release_job()["steps"] if s.get("name") == "install"]
    assert "pip install 'tfcompile[eval]'" in install["run"] and "torch==2.13.0" in install["run"]
    assert "python3.11-doc" in install["run"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'eval = ["lm-eval==0.4.*"]' in pyproject


def test_release_job_runs_every_step(tmp_path):
    job, work = release_job(), tmp_path / "checkout"
    work.mkdir()
    secret = _keys(work)
    env = {**os.environ, **{k: str(v) for k, v in job["env"].items()}, "MODEL": str(DEMO),
           "PUBLISH_DIR": str(tmp_path / "srv-models"), "TFCOMPILE_CACHE": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # `tfcompile` of this Python
    ran = []
    for step in job["steps"]:
        if "run" not in step or step["name"] == "install":
            continue
        step_env = {k: secret if "secrets.TFCOMPILE_SIGNING_KEY" in str(v) else str(v)
                    for k, v in step.get("env", {}).items()}
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=work,
                           env={**env, **step_env}, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"step {step['name']!r}: {r.stderr[-3000:]}"
        ran.append(step["name"])
    assert ran == ["signing key", "quantize and gate", "verify the signature", "publish"]
    out = work / job["env"]["OUT"]
    q = json.loads((work / "quantize.json").read_text())
    assert q["ok"] is True and [t["task"] for t in q["eval"]["tasks"]] == ["pydoc_cloze"]
    suite = ET.parse(work / "gates.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("3", "0")
    v = json.loads((work / "verify.json").read_text())
    assert v["ok"] is True and any(c["check"] == "signature" and c["ok"] for c in v["checks"])
    # the report's KL plot and the eval table's KL: the same positions, and the lens's last layer agrees
    page = (out / "tfcompile" / "report.html").read_text()
    tokens, lens = q["eval"]["metrics"]["tokens"], q["eval"]["layer_kl_positions"]
    if tokens <= lens:
        assert f"on all {tokens} evaluation positions (the last one is the table&#x27;s KL)" in page
        assert q["eval"]["layer_kl"][-1]["kl_mean"] == pytest.approx(q["eval"]["metrics"]["kl_mean"], rel=1e-3)
    else:  # the lens samples the positions, and the page says how many
        assert f"on {lens} of the {tokens} evaluation positions spread evenly over the text" in page
    assert (tmp_path / "srv-models" / out.name / "tfcompile" / "manifest.json").is_file()
    assert oct((work / "release.pem").stat().st_mode & 0o777) == "0o600"  # umask 077
