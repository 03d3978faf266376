"""tfcompile.tasks: task accuracy through lm-evaluation-harness (the optional `eval` extra).

Modules: adapter (`TfcompileLM`, lm-eval's model `tfcompile`: an artifact as `tfcompile eval`
emulates it, or a checkpoint; imports lm_eval, so only import it when lm-eval is installed),
gate (task specs -> scores of candidate and reference -> gate entries; lm-eval imported lazily),
cloze (`pydoc-cloze`, this project's own small multiple-choice task, built from the Python docs
on the machine). See docs/ci.md "Task gates".
"""
