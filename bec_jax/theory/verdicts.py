"""Verdicts on a run: what the exact analysis and the run's curve say together.

A curve alone cannot tell "converged" from "moving too slowly to see": a mode
that decays or grows at 1e-4 per step changes the error by under 5% over the
last quarter of a 2000-step run. So a verdict here comes from the expected
update of the chosen step sizes (`analysis.expected_update`: E[x_{t+1} - x_t | x_t]
= G x_t + g) and the run's curve only adds what was observed.

The mean of a linear method's iterates follows the discrete map
x -> x + G x + g exactly, so relative to the fixpoint set each eigenmode of G
(eigenvalue lambda) is multiplied by |1 + lambda| per step. Its per-step rate is
log|1 + lambda|: > 0 grows, < 0 decays. For small step sizes this equals
Re(lambda) to first order (the ODE's rate); for large ones it does not, e.g. a
complex pair with Re(lambda) < 0 can still have |1 + lambda| > 1 and grow.
An eigenvalue within `neutral_tol` of 0 is a neutral mode: a direction along
which the fixpoints form an affine set (a singular A_c on Boyan or Baird). It
neither grows nor decays and is left out of both rates. Rates are per mode; the
conditioning of the eigenbasis (transient amplification) is not included.

One sign convention for rates everywhere: a rate is the per-step logarithm of a
growth factor, < 0 decays and > 0 grows (`Exact.rate`, `MeanSquare.rate`).

The mean can converge while every run diverges: the sampling noise grows the
second moment. Given the exact mean-square analysis (`mean_square.mean_square`,
the second-moment operator of the sampled recursion), `verdict` says which of
the two failed: "diverges" (in mean) or "mean stable, variance grows".
"""
from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

# The growth factor at which a divergence is plainly visible in a run (the
# sweep's divergence bound on |x| is of this order).
VISIBLE_GROWTH = 1e6
# Relative fall over the last quarter above which a curve is still "decreasing"
# (the old label's threshold, now only a description of the run).
_STILL_FALLING = 0.05

LABELS = ("diverges", "unstable (not yet visible)", "converges", "converging (slowly)",
          "stable in expectation, run diverged", "mean stable, variance grows")
# `MeanSquare.label`'s values: the exact analysis alone, without a run.
STABILITY_LABELS = ("diverges in mean", "mean stable, variance grows", "stable in mean square")


class Exact(NamedTuple):
    """The exact analysis of the mean dynamics x -> x + G x + g.

    Attributes:
      stable: no non-neutral mode grows (|1 + lambda| <= 1).
      rate: per-step rate max log|1 + lambda| over the non-neutral modes: > 0
        the fastest-growing mode's growth (unstable), <= 0 the slowest mode's
        decay (stable); 0.0 when every mode is neutral. The one signed number;
        `growth` and `slowest` are its magnitudes.
      neutral: number of neutral modes (|lambda| <= neutral_tol).
      steps_to_tol: steps for the slowest mode to shrink by the factor `tol`,
        log(tol) / rate; 0 when every mode is neutral (or dies in one step);
        inf when unstable or when a non-neutral mode does not decay.
      tol: the factor of `steps_to_tol`.
    """

    stable: bool
    rate: float
    neutral: int
    steps_to_tol: float
    tol: float

    @property
    def growth(self) -> float:
        """max(rate, 0): the growth rate when unstable, else 0."""
        return max(self.rate, 0.0) if not self.stable else 0.0

    @property
    def slowest(self) -> float:
        """max(-rate, 0): the slowest mode's decay rate when stable, else 0."""
        return max(-self.rate, 0.0) if self.stable else 0.0


def exact(G, tol: float = 1e-3, neutral_tol: float = 1e-10) -> Exact:
    """The `Exact` analysis of an expected-update matrix G (see the module docstring)."""
    G = np.asarray(G, np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"G: expected a square matrix, got shape {G.shape}")
    if not np.all(np.isfinite(G)):
        raise ValueError("G: has non-finite entries")
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol: expected a value in (0, 1), got {tol}")
    lam = np.linalg.eigvals(G) if G.size else np.zeros(0, complex)
    is_neutral = np.abs(lam) <= neutral_tol
    live = lam[~is_neutral]
    # log|1 + lambda| = 0.5 log1p(2 Re + Re^2 + Im^2): accurate for tiny lambda,
    # where log(abs(1 + lambda)) would lose the digits that are the rate.
    with np.errstate(divide="ignore"):
        rate = 0.5 * np.log1p(2.0 * live.real + live.real ** 2 + live.imag ** 2)
    neutral = int(is_neutral.sum())
    if live.size and rate.max() > 0.0:
        return Exact(False, float(rate.max()), neutral, math.inf, tol)
    if not live.size:  # only neutral modes: already on the fixpoint set's directions
        return Exact(True, 0.0, neutral, 0.0, tol)
    top = float(rate.max())  # <= 0 here; -inf if every mode dies in one step
    steps = math.log(tol) / top if top < 0.0 else math.inf
    return Exact(True, top, neutral, steps, tol)


def exact_for(env, algorithm, hyperparameters: dict | None, tol: float = 1e-3,
              neutral_tol: float = 1e-10) -> Exact:
    """`exact` of the algorithm's expected update on `env` at these step sizes
    (`analysis.expected_update`; an algorithm's traces are handled there)."""
    from bec_jax.theory import (
        expected_updates as analysis,  # JAX only when a model is analysed
    )

    G, _ = analysis.expected_update(env, algorithm, hyperparameters)
    return exact(G, tol=tol, neutral_tol=neutral_tol)


def mean_square_for(env, algorithm, hyperparameters: dict, sampler: str = "markov", tol: float = 1e-3):
    """`mean_square.mean_square` of the algorithm on `env` at these constant step
    sizes: the exact mean and mean-square stability of the sampled recursion."""
    from bec_jax.theory import mean_square  # JAX only when a model is analysed

    return mean_square.mean_square(env, algorithm, hyperparameters, sampler, tol)


_LABELS: dict = {}  # (model fingerprint, algorithm, step sizes, sampler) -> label: `exact_label`'s cache
_PENDING: dict = {}  # key -> threading.Event of a label being computed (`exact_label` in another thread)
_LABELS_LOCK = threading.Lock()


def exact_label(env, algorithm: str, hyperparameters: dict, sampler: str = "markov") -> str | None:
    """The exact mean-square label of the algorithm on `env` at these constant
    step sizes (`mean_square_for(...).label`, computed by `mean_square.label`),
    cached per model, algorithm, step sizes and sampler; None where the
    analysis does not apply (a trace method). A label another thread is
    computing (a `Prefetch` thread, say) is waited for, not computed twice."""
    from bec_jax import (
        mdp,  # the model's fingerprint; JAX only when a model is analysed
    )

    key = (mdp.fingerprint(env), algorithm, tuple(sorted(hyperparameters.items())), sampler)
    with _LABELS_LOCK:
        if key in _LABELS:
            return _LABELS[key]
        pending = _PENDING.get(key)
        if pending is None:
            _PENDING[key] = threading.Event()
    if pending is not None:
        pending.wait()
        with _LABELS_LOCK:
            if key in _LABELS:
                return _LABELS[key]
        return exact_label(env, algorithm, hyperparameters, sampler)  # the other thread failed
    try:
        from bec_jax.theory import mean_square
        label = mean_square.label(env, algorithm, hyperparameters, sampler)
    except ValueError:  # trace methods and the like: no exact second moment
        label = None
    finally:
        with _LABELS_LOCK:
            event = _PENDING.pop(key)
        event.set()
    with _LABELS_LOCK:
        _LABELS[key] = label
    return label


class Prefetch:
    """A background thread that makes calls whose results land in caches
    (a sweep's summary labels: `results.prefetch_summary`), once `start` (an event; None: at once) is set:
    `close()` stops it after the call under way and waits for it (call it in
    a `finally`: a run that fails does not wait for the rest of the
    analysis); `close(wait=False)` does not wait (a stopped run exits now,
    and the thread, a daemon, with it)."""

    def __init__(self, calls: list, start: threading.Event | None = None):
        self._stop = threading.Event()
        self._start = start
        self._thread = threading.Thread(target=self._work, args=(calls,), name="bec-jax-analysis", daemon=True)
        self._thread.start()

    def _work(self, calls: list) -> None:
        if self._start is not None:
            self._start.wait()
        for fn, args in calls:
            if self._stop.is_set():
                return
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - the later call computes it again and reports
                pass

    def close(self, wait: bool = True) -> None:
        """Stops the thread after its call under way; waits for it with `wait`."""
        self._stop.set()
        if self._start is not None:
            self._start.set()
        if wait:
            self._thread.join()


def curve_trend(curve, diverged: bool) -> str:
    """How a mean error curve over the logged steps behaved: "diverged" (the
    flag, or a non-finite value), "growing" (last > first), "decreasing" (the
    last quarter still fell by more than 5%) or "flat". A description of the
    run, never a verdict on its own."""
    c = np.asarray(curve, np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"curve: expected a non-empty 1-D array, got shape {c.shape}")
    if diverged or not np.all(np.isfinite(c)):
        return "diverged"
    if c[-1] > c[0]:
        return "growing"
    q = c[-(len(c) // 4 + 1):]
    return "decreasing" if q[0] - q[-1] > _STILL_FALLING * abs(q[-1]) + 1e-12 else "flat"


class Verdict(NamedTuple):
    """A label from `LABELS` and a one-line reason naming what decided it."""

    label: str
    reason: str


def _steps_text(s: float) -> str:
    return "never" if not math.isfinite(s) else str(math.ceil(s))


def _rate_text(r: float) -> str:
    return f"{r:+.2e}/step"


def verdict(ex: Exact, curve, steps: int, diverged: bool, ms=None) -> Verdict:
    """The verdict on a run of `steps` steps: stability and rates from the exact
    analysis `ex` of the mean, what was seen from its mean `curve`
    (`curve_trend`). With `ms`, the exact mean-square analysis of the sampler
    the run used (`mean_square.MeanSquare`), a run whose mean is stable but
    whose second moment grows is "mean stable, variance grows" (the reason
    gives both rates), and the mean's stability is that of the sampler's own
    first-moment operator (under Markov sampling it can differ from the
    i.i.d. mean `ex` describes)."""
    trend = curve_trend(curve, diverged)
    run = f"run: {trend} over {steps} steps"
    mean_stable, mean_rate = ex.stable, ex.rate
    if ms is not None and ex.stable and not ms.mean_stable:
        mean_stable, mean_rate = False, ms.mean_rate
    if not mean_stable:
        growth = f"analysis: diverges in mean, rate {_rate_text(mean_rate)}"
        if ms is not None and ex.stable:
            growth += f" under {ms.sampler} sampling (the i.i.d. mean is stable)"
        if trend in ("diverged", "growing"):
            return Verdict("diverges", f"{growth}; {run}")
        visible = math.log(VISIBLE_GROWTH) / mean_rate
        return Verdict("unstable (not yet visible)",
                       f"{growth}, a {VISIBLE_GROWTH:.0e} growth shows after ~{_steps_text(visible)} steps; "
                       f"{run}, so not yet visible")
    modes = f"rate {_rate_text(ex.rate)}" + (f", {ex.neutral} neutral" if ex.neutral else "")
    if ms is not None and not ms.bounded:
        visible = math.log(VISIBLE_GROWTH) / ms.rate if ms.rate > 0 else math.inf
        return Verdict("mean stable, variance grows",
                       f"analysis: stable in mean ({modes}) but the second moment grows under {ms.sampler} "
                       f"sampling (RMS rate {_rate_text(ms.rate)}, a {VISIBLE_GROWTH:.0e} growth shows after "
                       f"~{_steps_text(visible)} steps); {run}")
    square = "" if ms is None else f"; bounded in mean square (RMS rate {_rate_text(ms.rate)})"
    if trend == "diverged":
        return Verdict("stable in expectation, run diverged",
                       f"analysis: stable in mean ({modes}){square}; run: diverged over {steps} steps "
                       "(sampling noise or a step too large for the sampled recursion)")
    within = f"it shrinks by {ex.tol:.0e} in {_steps_text(ex.steps_to_tol)} steps"
    if steps >= ex.steps_to_tol:
        return Verdict("converges", f"analysis: stable in mean, {modes}, {within} <= {steps}{square}; {run}")
    return Verdict("converging (slowly)",
                   f"analysis: stable in mean, {modes}, {within} > the run's {steps}{square}; {run}")
