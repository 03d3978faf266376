"""Issue 24, case 9 (the rest): problems of the input or the machine that were reported as
internal errors (exit 2, a Python exception, "rerun with --until"): an unknown architecture with
`auto_map` under --allow-unknown-architecture, TMPDIR full while GPTQ spills Hessians, a MODEL
name too long for the file system. Each is exit 1 naming the file or option, with a hint."""

from __future__ import annotations

import json

import pytest

from safety_helpers import assert_clean_failure, quantize_to

CALIB = ("--calib", "random", "--calib-samples", "4", "--calib-seq-len", "16")


@pytest.fixture
def custom_code_model(tiny_llama):
    """tiny_llama renamed to an architecture transformers lacks, whose auto_map names remote code."""
    cfg = json.loads((tiny_llama / "config.json").read_text())
    cfg.update(architectures=["MyLlamaForCausalLM"], model_type="my_llama",
               auto_map={"AutoConfig": "conf.MyConfig", "AutoModelForCausalLM": "model.MyModel"})
    (tiny_llama / "config.json").write_text(json.dumps(cfg))
    return tiny_llama


@pytest.mark.parametrize("args,needle", [
    (("--format", "nvfp4", *CALIB), "calibrate"),  # W4A4: activation scales need the model's forward
    (("--format", "nvfp4a16", "--algorithm", "gptq", *CALIB), "calibrate"),
    (("--format", "nvfp4a16", "--eval"), "eval"),
])
def test_unknown_architecture_with_custom_code_and_a_pass_that_runs_it(args, needle, custom_code_model, tmp_path,
                                                                       run_cli):
    out = tmp_path / "o"
    res = run_cli("quantize", custom_code_model, "-o", out, *args, "--allow-unknown-architecture")
    assert_clean_failure(res, out, "config.json", "MyLlamaForCausalLM", "auto_map", needle, "must run the model")


def test_unknown_architecture_data_free_still_quantizes(custom_code_model, tmp_path, run_cli):
    res = run_cli("quantize", custom_code_model, "-o", tmp_path / "o", "--format", "nvfp4a16",
                  "--allow-unknown-architecture", "-q")
    assert res.code == 0, res.err


def test_eval_against_a_custom_code_reference(custom_code_model, tiny_llama_src, tmp_path, run_cli):
    art = quantize_to(tiny_llama_src, tmp_path / "art")
    res = run_cli("eval", art, "--reference", custom_code_model, "--max-tokens", "16")
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, (res.code, res.err)
    assert "config.json" in res.err and "auto_map" in res.err, res.err


def test_tmpdir_full_while_gptq_spills_hessians(tiny_llama, tmp_path, run_cli, monkeypatch):
    from safetensors import SafetensorError

    from tfcompile.calibration import sequential

    def full(tensors, path, *a, **k):  # what safetensors raises when the disk fills (measured on a 64 KiB tmpfs)
        open(path, "wb").close()  # a partial file, as a real full disk leaves
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(sequential.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setattr(sequential, "save_file", full)
    out = tmp_path / "o"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--algorithm", "gptq", *CALIB)
    assert_clean_failure(res, out, "spill GPTQ Hessians", "No space left on device", "TMPDIR", str(tmpdir))
    assert [p.name for p in tmpdir.iterdir() if p.name.startswith("tfcompile-")] == []


def test_model_name_too_long_for_the_file_system(tmp_path, run_cli):
    model = tmp_path / ("m" * 300)
    out = tmp_path / "o"
    res = run_cli("quantize", model, "-o", out, "--format", "fp8-dynamic")
    assert_clean_failure(res, out, "m" * 40, "too long", "shorter name")


def test_out_name_too_long_for_the_file_system(tiny_llama, tmp_path, run_cli):
    out = tmp_path / ("o" * 250)  # fits, but not with the .lock / .tmp-<owner> suffixes tfcompile adds
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic")
    assert_clean_failure(res, out, "o" * 40, "too long", "shorter name")
