"""Rotations fused into the weights (QuaRot/SpinQuant R1, R2): hadamard.py builds them, fuse.py applies them."""
