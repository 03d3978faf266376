"""Write an artifact as an ONNX model: `export_onnx` (into a directory being built) and
`export_to_path` (the standalone command: atomic, never leaves a partial file).

Why the graph is built here with onnx.helper rather than traced with
torch.onnx: docs/onnx.md "Design". In short, tracing runs a float model, so
its initializers are the dequantized weights (the whole model materialised
in memory, 3.6x the bytes of NVFP4 even in bf16), and getting FLOAT4E2M1/E4M3/E8M0
initializers back means rewriting the graph afterwards, as modelopt does.
Building the Llama-family graph directly lets every initializer be the
artifact's own bytes, streamed tensor by tensor.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tfcompile import __version__
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.io.oserrors import write_error
from tfcompile.io.out_policy import check_output
from tfcompile.onnx_export.config import OnnxExportConfig, OnnxExportError
from tfcompile.onnx_export.decoder import Decoder
from tfcompile.onnx_export.graph import Graph
from tfcompile.onnx_export.inline import write_inline
from tfcompile.onnx_export.source import ArtifactView, Tensors, check_exportable
from tfcompile.onnx_export.writer import TensorSink


@dataclass(frozen=True)
class ExportResult:
    path: Path  # the .onnx file
    files: dict[str, str]  # file name (beside `path`) -> sha256: the .onnx and its external data, if any
    opset: int
    external_data: bool
    initializers: int
    initializer_bytes: int
    custom_ops: tuple[str, ...]  # "domain::Op" of every model-local function the graph calls
    seconds: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict:
        return {"files": self.files, "opset": self.opset,
                "external_data": self.external_data, "initializers": self.initializers,
                "initializer_bytes": self.initializer_bytes, "custom_ops": list(self.custom_ops)}


def data_name(onnx_name: str) -> str:
    """External data file of `model.onnx`: `model.onnx.data` (torch.onnx's convention)."""
    return onnx_name + ".data"


def export_onnx(view: ArtifactView, out: Path, cfg: OnnxExportConfig, reporter=None) -> ExportResult:
    """Write `out` (and `out`.data) for the artifact `view`. The caller owns the directory
    and cleans it on error (a pass's staging dir, or export_to_path's temp dir)."""
    t0 = time.perf_counter()
    cfg.check()
    check_exportable(view, cfg.opset)
    out = Path(out)
    data_path = out.with_name(data_name(out.name))
    ckpt = open_checkpoint(view.path)
    try:
        external = _external(cfg, ckpt.total_bytes)  # every tensor of the artifact becomes an initializer
        sink = TensorSink(data_path)  # always streamed first: memory follows one layer
        try:
            if reporter is not None:
                reporter.task("export onnx", None)
            g = Graph(sink, cfg.opset)
            tensors = Tensors(ckpt)
            logits = Decoder(g, tensors, view).build()
            tensors.check_all_used(view.path)
            model = _model(g, view, logits)
            data_sha = sink.close()
        except BaseException:
            sink.abort()
            raise
    finally:
        ckpt.close()
    proto_sha = _save(model, out)
    onnx.checker.check_model(str(out), full_check=True)  # never hand out a graph the checker rejects
    if external:
        files = {out.name: proto_sha, data_path.name: data_sha}
    else:  # one self-contained file, written without loading the weights
        files = {out.name: write_inline(model, data_path, out)}
        data_path.unlink()
    ops = tuple(sorted(f"{d}::{n}" for d, n in g.functions))
    return ExportResult(out, dict(sorted(files.items())), cfg.opset, len(files) > 1, len(g.initializers),
                        sum(map(initializer_nbytes, g.initializers)), ops, time.perf_counter() - t0)


def initializer_nbytes(t: TensorProto) -> int:
    """Payload bytes of an initializer, inline or external."""
    if t.data_location == TensorProto.EXTERNAL:
        return int({e.key: e.value for e in t.external_data}["length"])
    return len(t.raw_data)


def _external(cfg: OnnxExportConfig, total_bytes: int) -> bool:
    if cfg.external_data == "always":
        return True
    if total_bytes <= cfg.inline_limit:
        return False
    if cfg.external_data == "never":
        raise OnnxExportError(f"the weights are {total_bytes / 2**30:.2f} GiB; one ONNX file holds at most "
                              f"{cfg.inline_limit / 2**30:.2f} GiB (protobuf's 2 GiB limit)",
                              hint="use --external-data auto (the default) or always")
    return True


def _model(g: Graph, view: ArtifactView, logits: str) -> onnx.ModelProto:
    batch_seq = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, batch_seq),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, batch_seq)]
    outputs = [helper.make_tensor_value_info(logits, TensorProto.FLOAT,
                                             batch_seq + [int(view.config["vocab_size"])])]
    graph = helper.make_graph(g.nodes, "tfcompile", inputs, outputs, g.initializers)
    fmt = view.scheme.name if view.scheme else "none"
    graph.doc_string = (f"{view.config['architectures'][0]} exported by tfcompile, format {fmt}; quantized "
                        "weights keep their types and feed DequantizeLinear (docs/onnx.md)")
    opsets = [helper.make_opsetid("", g.opset)] + [helper.make_opsetid(d, 1) for d in sorted(g.domains)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[g.functions[k] for k in sorted(g.functions)],
                              producer_name="tfcompile", producer_version=__version__,
                              ir_version=helper.find_min_ir_version_for(opsets[:1]))
    s = view.scheme
    helper.set_model_props(model, {"tfcompile.format": s.name if s else "none",
                                   "tfcompile.weight": s.weight if s else "none",
                                   "tfcompile.activations": (s.act if s else None) or "none"})
    return model


def _save(model: onnx.ModelProto, out: Path) -> str:
    """Serialize `model` to `out` (fsynced); returns its sha256."""
    data = model.SerializeToString()
    with open(out, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def export_to_path(view: ArtifactView, out: Path, cfg: OnnxExportConfig, *, overwrite: bool = False,
                   reporter=None) -> ExportResult:
    """`tfcompile export-onnx`: build in a hidden temporary sibling directory, then rename the
    .onnx (and its .data) into place; on any error nothing is left behind."""
    cfg.check()
    check_exportable(view, cfg.opset)  # fail before touching the file system
    out = Path(out).absolute()
    targets = [out, out.with_name(data_name(out.name))]
    for t in targets:
        check_output(t, [("input", view.path)], label="-o")  # never into the input, cwd or a Hub cache
        if t.is_dir():
            raise OnnxExportError(f"{t} is a directory", hint="-o names the .onnx file to write")
        if os.path.lexists(t) and not overwrite:
            raise OnnxExportError(f"{t} already exists", hint="pass --overwrite to replace it, or choose another path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        raise write_error(out.parent, e, "create a file in") from e
    try:
        res = export_onnx(view, tmp / out.name, cfg, reporter)
        stale = [t for t in targets if t.name not in res.files and os.path.lexists(t)]
        for name in sorted(res.files, key=lambda n: n != data_name(out.name)):  # data first, graph last
            os.replace(tmp / name, out.parent / name)
        for t in stale:  # an --overwrite'n inline export drops the old external data
            t.unlink()
    except OSError as e:
        raise write_error(out, e) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(out, res.files, res.opset, res.external_data, res.initializers, res.initializer_bytes,
                        res.custom_ops, res.seconds)
