"""Orthogonal rotations for the residual stream and the attention heads.

A Hadamard matrix H (entries +-1, H H^T = n I) divided by sqrt(n) is orthogonal and spreads
every input coordinate evenly over all outputs, which turns a few outlier channels into many
ordinary ones (QuaRot, Ashkboos et al. 2024). With random signs on its columns it is the
"randomized Hadamard" QuaRot and SpinQuant start from. Orders built here:

- Sylvester: 2^k;
- Paley I: q + 1 for a prime q = 3 (mod 4);
- Paley II: 2 (q + 1) for a prime q = 1 (mod 4);
- Kronecker products of a Paley matrix with a Sylvester one: m * 2^k.

That covers the hidden sizes of current LLMs (SmolLM2's 576 = 36 x 16 with Paley II, q = 17;
powers of two; 5120 = 20 x 256; 3584 = 28 x 128 ...). For any other order `rotation` falls back
to a seeded random orthogonal matrix (QR of a Gaussian), which spreads outliers as well, only
without the +-1 structure (which matters for online kernels, not for rotations fused offline).
"""

from __future__ import annotations

import math

import torch


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(math.isqrt(q)) + 1))


def sylvester(n: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order n (a power of two), float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    if h.shape[0] != n:
        raise ValueError(f"{n} is not a power of two")
    return h


def _jacobsthal(q: int) -> torch.Tensor:
    """Q[i, j] = chi(j - i), chi the quadratic character mod the prime q (0 at 0)."""
    squares = {(x * x) % q for x in range(1, q)}
    chi = torch.tensor([0.0] + [1.0 if a in squares else -1.0 for a in range(1, q)], dtype=torch.float64)
    idx = (torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q
    return chi[idx]


def paley(m: int) -> torch.Tensor | None:
    """A Hadamard matrix of order m by Paley's constructions, or None when neither applies."""
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    q = m - 1
    if _is_prime(q) and q % 4 == 3:  # Paley I: H = I + [[0, 1^T], [-1, Q]]
        s = torch.zeros(m, m, dtype=torch.float64)
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
        return torch.eye(m, dtype=torch.float64) + s
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:  # Paley II
        q = m // 2 - 1
        c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
        c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
        a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
        b = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
        return torch.kron(c, a) + torch.kron(torch.eye(q + 1, dtype=torch.float64), b)
    return None


def hadamard(n: int) -> torch.Tensor | None:
    """A Hadamard matrix of order n (float64, entries +-1), or None if none is constructed here."""
    m = n
    while m % 2 == 0 and m > 1:
        m //= 2
    while m <= n:  # n = m * 2^k: try the smallest Paley factor first
        if n % m == 0 and (n // m) & (n // m - 1) == 0:
            base = paley(m)
            if base is not None:
                h = torch.kron(base, sylvester(n // m))
                if torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64)):
                    return h
        m *= 2
    return None


def rotation(n: int, kind: str = "hadamard", seed: int = 0) -> torch.Tensor:
    """An orthogonal n x n matrix (float64): a Hadamard matrix with random column signs, divided by
    sqrt(n) ("hadamard", a random orthogonal matrix when no Hadamard matrix of order n is built
    here), or a random orthogonal matrix ("random"). Seeded; the same seed gives the same matrix."""
    gen = torch.Generator().manual_seed(seed)
    h = hadamard(n) if kind == "hadamard" else None
    if h is not None:
        signs = torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1
        return h * signs[None, :] / math.sqrt(n)
    if kind not in ("hadamard", "random"):
        raise ValueError(f"unknown rotation kind {kind!r}")
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))[None, :]


def rotation_keeping(n: int, keep: tuple[int, ...], kind: str = "hadamard", seed: int = 0) -> torch.Tensor:
    """An orthogonal n x n matrix (float64) that leaves the coordinates `keep` where they are
    (identity rows and columns) and rotates the other n - len(keep) among themselves with
    `rotation(n - len(keep), kind, seed)` (a random orthogonal matrix when no Hadamard matrix of
    that order is built here). With `keep` empty it is `rotation(n, kind, seed)`."""
    kept = sorted(set(keep))
    if not kept:
        return rotation(n, kind, seed)
    if kept[0] < 0 or kept[-1] >= n:
        raise ValueError(f"kept channel {kept[0] if kept[0] < 0 else kept[-1]} is outside 0..{n - 1}")
    skip = set(kept)
    rest = torch.tensor([c for c in range(n) if c not in skip], dtype=torch.long)
    q = torch.eye(n, dtype=torch.float64)
    if rest.numel():
        q[rest[:, None], rest[None, :]] = rotation(rest.numel(), kind, seed)
    return q
