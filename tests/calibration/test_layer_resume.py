"""`quantize --resume-dir` (calibrate.resume_dir, calibration/layer_resume.py): a layer-loop run
killed while solving a layer resumes at that layer, solves only what is left, and writes the
same artifact, byte for byte, as a run that was never interrupted (its oracle)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tfcompile.calibration import propagate

COMMON = ["--calib", "random", "--calib-samples", "4", "--calib-seq-len", "32", "--set", "calibrate.batch=2"]
CASES = {  # the two layer solvers: learned rounding (always in the loop), GPTQ under propagate
    "signround": ["--format", "mxfp4a16", "--algorithm", "signround", "--set", "quantize.signround_iters=6"],
    "gptq-propagate": ["--format", "nvfp4", "--algorithm", "gptq", "--set", "calibrate.propagate=true"],
}


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _kill_at(monkeypatch, layer: int, solved: list[int]) -> None:
    """Layer `layer`'s solve dies (a kill between two saved layers); `solved` lists the layers
    whose solver really ran."""
    real = propagate.LayerPropagation.solve

    def solve(self, i, rec, block=None):
        if i == layer:
            raise RuntimeError("killed")
        before = len(self.resume.resumed) if self.resume is not None else 0
        out = real(self, i, rec, block)
        if self.resume is None or len(self.resume.resumed) == before:
            solved.append(i)
        return out

    monkeypatch.setattr(propagate.LayerPropagation, "solve", solve)


@pytest.mark.parametrize("case", CASES)
def test_killed_run_resumes_byte_identically(case, tiny_llama, tmp_path, run_cli, monkeypatch):
    args = ["quantize", tiny_llama, *CASES[case], *COMMON, "--json"]
    plain = run_cli(*args, "-o", tmp_path / "plain")
    assert plain.code == 0, plain.err
    out, resume = tmp_path / "out", tmp_path / "resume"
    solved: list[int] = []
    _kill_at(monkeypatch, 1, solved)
    res = run_cli(*args, "-o", out, "--resume-dir", resume)
    assert res.code == 2 and "killed" in res.err, res.err
    assert not out.exists()  # nothing published
    assert solved == [0] and sorted(p.name for p in resume.glob("layer-*")) == ["layer-00000.rank0.safetensors"]

    solved.clear()
    monkeypatch.undo()
    _kill_at(monkeypatch, -1, solved)  # no kill: count what the resumed run solves
    res = run_cli(*args, "-o", out, "--resume-dir", resume)
    assert res.code == 0, res.err
    stats = res.json()["passes"]["calibrate"]
    assert stats["resumed_layers"] == 1 and solved == [1]  # layer 0 read back, not solved again
    assert digest(out) == digest(tmp_path / "plain")
    if case == "signround":  # the solver's record of layer 0 came back with its answer
        assert stats["signround_block_loss"] == plain.json()["passes"]["calibrate"]["signround_block_loss"]


def test_another_run_or_a_damaged_layer_is_refused(tiny_llama, tmp_path, run_cli):
    args = ["quantize", tiny_llama, *CASES["signround"], *COMMON, "--resume-dir", tmp_path / "r"]
    assert run_cli(*args, "-o", tmp_path / "a").code == 0
    res = run_cli(*args, "--set", "quantize.signround_iters=7", "-o", tmp_path / "b")
    assert res.code == 1 and "holds another run (differs in: recipe)" in res.err and "hint:" in res.err, res.err
    layer = tmp_path / "r" / "layer-00001.rank0.safetensors"
    layer.write_bytes(layer.read_bytes()[:100])  # cut short, as a full disk would leave a copied folder
    res = run_cli(*args, "-o", tmp_path / "c")
    assert res.code == 1 and str(layer) in res.err and "hint: delete" in res.err, res.err
    assert not (tmp_path / "c").exists()
