"""`awq` algorithm: AWQ (Lin et al., 2023), per-channel scales folded into the preceding norm.

For a fusion group whose input x [T, K] is a norm's output (q/k/v <- input_layernorm,
gate/up <- post_attention_layernorm; calibration/awq_stats.py finds and verifies that edge),
    x W^T = (x / s) (W * s)^T        for any s > 0 [K],
and x / s costs nothing: it is the norm with its weight (and bias) divided by s. Input
channels with large activations get s > 1, so their weight columns are quantized on a finer
relative grid, where the error matters most (it is multiplied by large x).

- Search (once per group, when the quantize pass plans): s = m^a / sqrt(max(m^a) min(m^a)),
  m = mean |x| per input channel, a in GRID (0, 0.05, ..., 1). The loss is
  sum over the members of ||x W^T - A(x / s) Q(W * s)^T||^2 on the recorded input rows, with
  Q this scheme's weight quantization exactly as pack will run it (NVFP4: the group's shared
  global scale) and A its activation quantization for the W4A4/W8A8 schemes (static scales
  from the folded amax below; dynamic MX/FP8 as the engine does), identity for weight-only
  schemes. a = 0 gives s = 1, plain RTN, so the chosen loss is never above RTN's on those
  rows (ties keep the smaller a).
- Device (`quantize.device`, --device): the losses are computed there, one group's rows,
  weights and products at a time (the formats reference runs on any device: it is
  bit-identical to the CPU's fused kernels). s, w' and the amax are always computed on the
  CPU from the statistics. Off the CPU, alpha 0 and every alpha whose device loss is within
  TIE_RTOL of the least are scored again on the CPU, and the CPU's scores decide and are
  reported: the chosen alpha (hence s and the packed bytes, which pack encodes on the CPU)
  is the CPU run's unless a device loss is off by more than TIE_RTOL (GEMMs on another
  device sum in another order: fp32 rounding, ~1e-6 relative).
- Fold: the norm weight w becomes w' = dtype(w / s), and s is replaced by s' = w / w' (so
  w' * s' = w to float32 rounding: the fold is exact however w' was rounded); the search
  already scores s'. A norm bias is divided by s' too (rounded to its dtype). pack writes w'
  in place of the source's norm weight (Program.with_overrides), in both views.
- Static activation scales (nvfp4 W4A4, fp8): the group's input amax becomes the amax of
  x / s', max_j(amax_j / s'_j) from the per-channel maxima over every calibration token
  (a clipping observer's amax is scaled by the same factor, keeping its clipping ratio).
- Groups without AWQ statistics (o_proj, down_proj, whose input is not a norm output; fused
  MoE experts; a norm that feeds anything else) are RTN; the manifest says why.
Formats: NVFP4, MXFP4, MXFP8 and FP8 weights (every --format today); others are refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tfcompile.errors import RecipeError
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.calibration.awq_stats import AWQInput, awq_statistics
from tfcompile.ir import CalibStats, Program, QuantPlan, load_target, register_algorithm
from tfcompile.kernels import formats as F
from tfcompile.passes.quantize.rtn import quantize_weight, run_rtn
from tfcompile.reporter import Reporter
from tfcompile.schemes import Scheme

@dataclass(frozen=True)
class AWQFold:
    """One group's fold (Program.prepared): what `prepare_awq` decided, what `run_awq` applies."""
    norm: str  # norm module whose weight (and bias) is divided by s
    s: torch.Tensor  # float32 [K]: member weight columns are multiplied by it
    alpha: float
    loss: float  # output squared error on the recorded rows at `alpha`
    rtn_loss: float  # the same at alpha = 0 (plain RTN)


GRID = tuple(round(0.05 * i, 2) for i in range(21))  # alpha values; 0 = RTN
S_RANGE = (1e-4, 1e4)  # s is clamped to this range before normalisation (dead channels)
TIE_RTOL = 1e-3  # off the CPU: alphas whose device loss is this close to the least are re-scored on the CPU
HINT = ("AWQ searches any format with a weight quantizer in kernels/formats (NVFP4, MXFP4, MXFP8, FP8); "
        "use --algorithm rtn or gptq for this one")


def unsupported(scheme: Scheme) -> str | None:
    """Why AWQ cannot quantize this scheme's weights (None: it can)."""
    try:
        scheme.weights  # AWQ quantizes through the format's WeightQuantizer: any registered one
    except ValueError:
        return f"quantize.algorithm awq does not support format {scheme.name!r} ({scheme.weight} weights)"
    return None


def check_scheme(scheme: Scheme) -> None:
    """RecipeError unless AWQ can quantize this scheme's weights."""
    why = unsupported(scheme)
    if why:
        raise RecipeError(why, hint=HINT)


def awq_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = m^alpha normalised by sqrt(max * min) (AWQ's rule), float32 [K]; alpha 0 -> ones."""
    s = mean_abs.float().pow(alpha).clamp(*S_RANGE)
    return s / (s.max() * s.min()).sqrt()


def fold_norm(norm_w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w' = w / s in w's dtype, s' = w / w' float32 [K]): w' * s' == w to fp32 rounding.
    Channels where w or w' is 0 keep s (their input is 0 whatever s is)."""
    folded = (norm_w.float() / s).to(norm_w.dtype)
    ok = (folded.float() != 0) & (norm_w.float() != 0)
    eff = torch.where(ok, norm_w.float() / torch.where(ok, folded.float(), torch.ones_like(s)), s)
    return folded, eff


def fake_act(x: torch.Tensor, scheme: Scheme, amax: float, model_dtype: torch.dtype) -> torch.Tensor:
    """x [T, K] float32 through the scheme's activation quantize -> dequantize (float32);
    static scales from `amax` exactly as the artifact stores them."""
    acts = scheme.acts
    if acts is None:
        return x
    scale = acts.static_scale(amax, model_dtype).to(x.device) if acts.static else None  # stored scale, on x's device
    return acts.fake_quant(x, scale)


def group_loss(x, refs, weights, members, s, act_amax, program, model_dtype) -> float:
    """sum_members ||x W^T - A(x/s) Q(W*s)^T||^2 (a float32 BLAS dot per member, summed in float64).

    x [n, K] float32 recorded rows; refs[i] = x W_i^T; weights[i] float32 [N_i, K];
    act_amax: the static input amax of x/s (static-activation schemes)."""
    scheme = program.scheme
    ws = [w * s for w in weights]
    gscale = program.weights.group_global_scale(ws, [t.source for t in members])
    xq = fake_act(x / s, scheme, act_amax, model_dtype)
    err = 0.0
    for t, w, ref in zip(members, ws, refs):
        q = quantize_weight(w, program, gscale, t.source, model_dtype)
        d = (xq @ F.dequantize(q, torch.float32).T).sub_(ref).reshape(-1)
        err += float(torch.dot(d, d))
    return err


def awq_candidates(st, weights) -> list[tuple[float, torch.Tensor]]:
    """(alpha, s) for alpha in GRID: AWQ's activation-only rule; alpha 0 is s = 1 (RTN)."""
    return [(alpha, awq_scales(st.mean_abs, alpha)) for alpha in GRID]


def search(st, norm_w, weights, members, program, model_dtype,
           observed: float | None = None, candidates=awq_candidates,
           device: torch.device | str = "cpu") -> tuple[AWQFold, torch.Tensor]:
    """The candidate scale with the least group_loss (ties: the earlier one; the first must be
    s = 1, plain RTN); returns its fold and the folded norm weight w' (norm_w's dtype).
    `observed`: the group's calibrated static input amax (None: the per-channel maximum).
    `candidates(st, weights) -> [(alpha, s)]`: AWQ's rule, or SmoothQuant's (smoothquant.py).
    `device`: where the losses are computed (module docstring: off the CPU, the CPU re-scores
    the near-best candidates and decides)."""
    observed = float(st.max_abs.max()) if observed is None else observed
    cands = []  # per candidate: (alpha, s' float32 [K], w', static amax of x / s'), all on the CPU
    for alpha, s0 in candidates(st, weights):
        folded, s = fold_norm(norm_w, s0)
        cands.append((alpha, s, folded, folded_amax(observed, st, s)))
    score = scorer(st, weights, members, program, model_dtype, device)
    losses = [score(s, amax) for _, s, _, amax in cands]
    pick = range(len(cands))
    if torch.device(device).type != "cpu":
        least = min(losses)
        pick = [i for i, loss in enumerate(losses) if not loss > least * (1 + TIE_RTOL)] or [0]
        del score  # the device's copies go before the CPU's are made
        exact = scorer(st, weights, members, program, model_dtype, "cpu")
        losses = {i: exact(cands[i][1], cands[i][3]) for i in sorted({0, *pick})}
    best = min(pick, key=lambda i: (losses[i], i))
    alpha, s, folded, _ = cands[best]
    return AWQFold(st.norm, s, alpha, losses[best], losses[0]), folded


def scorer(st, weights, members, program, model_dtype, device):
    """A candidate's (s [K], static amax) -> group_loss, with one group's rows, weights and reference
    products x W^T copied to `device` once (float32: rows [n, K], weights [N_i, K], refs [n, N_i])."""
    x = st.rows.to(device=device, dtype=torch.float32)
    ws = [w.to(device=device, dtype=torch.float32) for w in weights]
    refs = [x @ w.T for w in ws]
    return lambda s, amax: group_loss(x, refs, ws, members, s.to(device), amax, program, model_dtype)


def prepare_awq(plan: QuantPlan, calib: CalibStats | None, source: Checkpoint, program: Program,
                reporter: Reporter, candidates=None) -> tuple[Program, dict]:
    """Search every norm-fed group, fold its scale into the norm (an override of the
    norm's passthrough tensor) and its static input amax; the rest stays RTN. `candidates`:
    the scale rule (AWQ's by default; smoothquant.py passes SmoothQuant's)."""
    check_scheme(program.scheme)
    algo = program.algorithm
    recorded = awq_statistics(calib)
    if not (recorded.inputs or recorded.skipped):
        raise RecipeError(f"quantize.algorithm {algo} needs activation statistics from the calibrate pass",
                          hint=f"use --algorithm {algo} (it schedules calibrate with awq=true)")
    folds, skipped, overrides, act = {}, dict(recorded.skipped), {}, dict(program.act_amax)
    reporter.task(f"{algo} search", len(recorded.inputs))
    for g in plan.groups:
        st = recorded.inputs.get(g.key)
        if st is None:
            skipped.setdefault(g.key, "no AWQ statistics")
            continue
        names = [n for n in (f"{st.norm}.weight", f"{st.norm}.bias") if n in plan.passthrough]
        if f"{st.norm}.weight" not in names:
            skipped[g.key] = f"{st.norm}.weight is not a tensor copied verbatim"
            continue
        fold, tensors = fold_group(g, st, names, source, program, candidates or awq_candidates)
        folds[g.key] = fold
        overrides.update(tensors)
        if program.scheme.act_static:
            act.update({t.module: folded_amax(act[t.module], st, fold.s) for t in g.members})
        source.release()
        reporter.advance(1, g.key)
    program = dataclasses.replace(program, act_amax=act, prepared=folds, skipped=skipped)
    stats = {"awq_groups": len(folds), "awq_rtn_groups": len(skipped),
             "awq_alpha": {k: f.alpha for k, f in folds.items()}}
    return program.with_overrides(overrides), stats


def folded_amax(observed: float, st: AWQInput, s: torch.Tensor) -> float:
    """The static input amax after the fold: max_j(amax_j / s_j) over the per-channel maxima.
    An observer that clipped (observed < max_j amax_j) keeps its clipping ratio."""
    full, folded = float(st.max_abs.max()), float((st.max_abs / s).max())
    if folded <= 0 or full <= 0:
        return observed
    return folded if observed >= full else observed * folded / full


def fold_group(group, st, names, source, program, candidates=awq_candidates) -> tuple[AWQFold, dict[str, torch.Tensor]]:
    """Search one group; returns its fold and the folded norm tensors (source name -> tensor)."""
    src = [load_target(source, t) for t in group.members]
    norm_w = source.get(names[0])
    if norm_w.shape[0] != src[0].shape[1]:
        raise RecipeError(f"awq: {names[0]} has {norm_w.shape[0]} channels, {group.key} takes "
                          f"{src[0].shape[1]}", hint="use --algorithm rtn for this model")
    observed = program.act_amax.get(group.members[0].module)  # static schemes: the observer's amax
    fold, folded = search(st, norm_w, [w.float() for w in src], group.members, program, src[0].dtype,
                          observed, candidates, device=program.device)
    out = {names[0]: folded}
    if len(names) > 1:
        bias = source.get(names[1])
        out[names[1]] = (bias.float() / fold.s).to(bias.dtype)
    for name, t in out.items():
        if not bool(torch.isfinite(t.float()).all()):
            raise RecipeError(f"awq: folding {group.key} made {name} non-finite",
                              hint="use --algorithm rtn for this model")
    return fold, out


@register_algorithm("awq", prepare=prepare_awq, supports=unsupported, hint=HINT, calibrate={"awq": True})
def run_awq(job, program, source):
    """RTN of W * s for groups with a fold (the same quantization the search scored)."""
    fold = program.prepared.get(job.group.key)
    if fold is None:
        out, stats = run_rtn(job, program, source)
        why = program.skipped.get(job.group.key, "no AWQ statistics")
        return out, [dict(x, algorithm="rtn", awq_skipped=why) for x in stats]
    weights = [load_target(source, t).float() * fold.s for t in job.group.members]
    out, stats = run_rtn(job, program, source, weights=weights)
    ratio = round(fold.loss / fold.rtn_loss, 4) if fold.rtn_loss > 0 else None
    return out, [dict(x, algorithm=program.algorithm, awq_alpha=fold.alpha, awq_norm=fold.norm,
                      awq_loss_vs_rtn=ratio) for x in stats]
