"""The quantize pass (quantize.py) and its algorithms, one module each (rtn, mse, gptq, awq,
smoothquant, signround), each registering its behaviour in tfcompile.ir.ALGORITHMS (and, for a
calibrated one, the statistics it needs: `register_algorithm(calibrate=...)`).

`ALGORITHM_HELP` is the one light table of their names: the CLI builds `--algorithm`'s choices
and help from it without importing torch (tfcompile/cli/flags.py); tests/cli/test_choices.py
holds it equal to the registry. Adding an algorithm: its module, its import in
passes/builtin.py, its line here (docs/design.md "What a change touches").
"""

ALGORITHM_HELP = {
    "rtn": "round to nearest; the default",
    "mse": "block-scale search",
    "gptq": "Hessian-aware; adds calibration",
    "awq": "activation-aware scales folded into the norms; adds calibration",
    "smoothquant": "activation outliers migrated into the weights through the norms; adds calibration",
    "signround": "learned rounding: rounding offsets and block scales tuned per decoder block by signed "
                 "gradient descent, as auto-round; NVFP4/MXFP4; adds calibration",
}
