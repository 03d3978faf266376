"""tfcompile: ahead-of-time compression and compilation of LLM checkpoints."""

__version__ = "0.1.0"
