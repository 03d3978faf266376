"""`python -m tfcompile ...`, which is how torchrun starts it: torchrun --nproc-per-node N -m tfcompile quantize ..."""

from tfcompile.cli.main import entry

if __name__ == "__main__":
    entry()
