"""Statistics shared by the seeded accuracy tests (scipy-free)."""

from __future__ import annotations

from statistics import NormalDist


def t_critical(alpha: float, df: int) -> float:
    """Two-sided Student-t critical value (Cornish-Fisher expansion)."""
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )
