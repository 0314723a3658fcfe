"""Statistics over seeds: Student-t quantiles and confidence intervals of a
mean, and Welch's interval of a difference of means.

Every interval the library reports on the host goes through here. The
statistics inside the programs (mean, std, sem over the seeds, bit for bit the
same on the host) are `engine.seed_stats`'s.

scipy is imported where a quantile is first needed, not with this module:
`scipy.special` takes a fifth of a second to import and `scipy.stats` a third,
which every command that never summarises a result would pay.
"""
from __future__ import annotations

import functools

import numpy as np


def t_quantile(df, level: float = 0.95):
    """The two-sided Student-t quantile for `df` degrees of freedom (NaN where df < 1).

    `scipy.special.stdtrit`, the function `scipy.stats.t.ppf` evaluates, without
    importing `scipy.stats` or its argument checks; one value per degree of
    freedom is remembered (a sweep's summary asks for the same few values
    thousands of times)."""
    df = np.asarray(df, float)
    if df.ndim == 0:
        return np.float64(_t_quantile_of(float(df), float(level)) if df >= 1 else np.nan)
    from scipy import special
    with np.errstate(invalid="ignore"):
        return np.where(df >= 1, special.stdtrit(np.maximum(df, 1), 0.5 + level / 2), np.nan)


@functools.lru_cache(maxsize=1024)
def _t_quantile_of(df: float, level: float) -> float:
    from scipy import special
    return float(special.stdtrit(df, 0.5 + level / 2))


def t_half_width(std, n, level: float = 0.95):
    """The half-width of the Student-t interval of a mean, elementwise over
    arrays: `std` the sample standard deviation (ddof=1), `n` the sample
    sizes; NaN where n < 2.

    The one formula of every interval this library reports from raw values
    (`t_interval`, the control curves); its operations and their order,
    quantile * std / sqrt(n), are part of the saved results' bits."""
    n = np.asarray(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = t_quantile(n - 1, level) * std / np.sqrt(n)
    return np.where(n >= 2, half, np.nan)


def t_half_width_of(values, axis: int = 0, level: float = 0.95):
    """`t_half_width` of the samples along `axis` of `values` (NaN, without
    numpy's warnings, for fewer than two)."""
    v = np.asarray(values, float)
    n = v.shape[axis]
    if n < 2:
        return np.full(np.delete(v.shape, axis), np.nan)
    with np.errstate(invalid="ignore", over="ignore"):  # infinite values: a NaN width, without numpy's warnings
        std = v.std(axis, ddof=1)
    return t_half_width(std, n, level)


def t_half_width_from_se(se, n, level: float = 0.95):
    """The half-width of the Student-t interval of a mean from its standard
    error `se` (std ddof=1 over sqrt(n), as the programs log it) and the
    sample sizes `n`, elementwise; NaN where n < 2.

    quantile * se: a different rounding from `t_half_width`'s
    quantile * std / sqrt(n), so the two are separate functions rather than
    one calling the other."""
    n = np.asarray(n)
    with np.errstate(invalid="ignore"):
        half = t_quantile(n - 1, level) * se
    return np.where(n >= 2, half, np.nan)


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t confidence interval of the mean of
    `values` (a 1-D sample); NaN bounds for fewer than two values."""
    v = np.asarray(values, float)
    n = v.size
    if n == 0:
        return np.nan, np.nan, np.nan
    mean = float(v.mean())
    if n < 2:
        return mean, np.nan, np.nan
    half = float(t_half_width_of(v, 0, level))
    return mean, mean - half, mean + half


def welch_interval(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t-interval of a difference of
    means over the finite values of `a` and `b`; NaN for fewer than two of
    either, and a zero-width interval when both are constant."""
    from scipy import stats
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return np.nan, np.nan, np.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = a.mean() - b.mean()
    se = np.sqrt(va + vb)
    if se == 0:
        return float(d), float(d), float(d)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    h = stats.t.ppf(0.5 + level / 2, df) * se
    return float(d), float(d - h), float(d + h)
