"""Theory-pruned grids (`bec-jax run ... --prune theory`): before a prediction
sweep, the exact mean-square analysis (`theory.mean_square`, the analysis
`bec-jax analyze` prints) gives every grid point's mean-square spectral
radius; the points it says diverge, beyond a safety margin, are skipped, and
the rest run as one sweep (`prune`).

What the analysis guarantees. At constant step sizes a linear method is the
recursion x_{t+1} = Gamma(Y_t) x_t + b(Y_t) of the sampled transitions Y_t,
and `mean_square` computes, exactly for the model and the sampler the sweep
uses (i.i.d. or Markov), the spectral radius rho of the operator that maps
E[x_t x_t^T] to E[x_{t+1} x_{t+1}^T]. rho > 1 says the second moment grows
like rho^t, so the RMS over runs like rho^(t/2), and nothing more. A run
follows its own product of random matrices, whose growth rate lambda (the top
Lyapunov exponent) is at most the RMS rate log(rho) / 2 (Jensen) and can be
far below it, even negative: a few rare runs that explode carry the second
moment while the typical run converges. No moment bounds lambda from below
(a product that hits a zero matrix converges in finite time whatever its
moments), so rho > 1 alone does not say that a run diverges.

Measured by benchmarks/prune_margin.py (lambda estimated from 3,000-step
products of the exact Gamma(Y) in float64, the neutral directions factored out,
for TD, CTD, TDC, CTDC, GTD2, TDRC, SRC and VRC on the 2-state example,
Baird's, Kolter's, a random MDP, Boyan's chain and the random walk, alpha from
1/256 to 4: 4,410 points with rho > 1 under Markov or i.i.d. sampling; about
25 minutes on one core):

* TD (and SRC) on the 2-state example (its behaviour policy's rho is 0 half
  the time and 2 the other half) has a mean and a second moment that both
  diverge at every alpha, yet from alpha = 0.75 to 1.5 every run converges
  (at alpha = 1.25 one sampled Gamma is 0: every run reaches the fixpoint).
  There rho reaches 1.98 under Markov sampling and 3.4 under i.i.d.
  sampling; on a finer grid lambda crosses 0 at alpha = 1.6, rho 3.69
  (i.i.d.). A sweep would find such a point good (at alpha = 1.25 it is the
  best of tests/test_prune.py's grid): pruning it would change the answer.
* Between rho = 2 and 3, some points grow at a few percent of the RMS rate
  (Kolter's TDC and CTDC at rho 2.0-2.8: 0.03-0.09 of it).
* From rho = 4 on, all 2,341 points grew run by run at >= 0.123 of the RMS
  rate (the least: Baird's CTD at beta = 1 under i.i.d. sampling).

So a point is pruned when both hold (`diverges`):

* rho >= MIN_RADIUS = 5, above the largest converging case measured (3.69)
  and past 4, from where every point measured grew at >= 0.123 of its rate;
* its runs, counted as growing at SAMPLE_RATE_RATIO = 0.05 of the RMS rate
  (about 0.4 of the least fraction measured), pass the sweep's divergence bound
  within its steps from a size of 1: 0.05 * log(rho) / 2 * steps >=
  log(divergence_bound) (at least 344 steps at rho = 5 and the default bound
  1e6). A point that diverges too slowly to show within the run is run: its
  curve is what the sweep reports, and the sweep, not the analysis, judges it.

The margin costs runs, never answers: a point between the boundary and the
margin (Baird's TD at alpha = 0.5, rho 2.3, or the 2-state TD at alpha = 3,
rho 3.6, both leave the bound within a few hundred steps) is run and shows
its divergence as any sweep shows it. A pruned point's runs leave the
divergence bound (tests/test_prune.py runs the pruned points of its grid and
checks that every seed diverged), so it would have a diverged seed and could
never be the sweep's best (`SweepResult.best_index` chooses among the points
with none): pruning does not change the point a sweep chooses. The margin
is not a theorem: a model unlike those measured could have runs that
converge past it; run the points (leave out --prune) where that matters.

The result of a pruned run holds the points that ran (its spec's explicit
`points`), so it loads, plots and compares as any sweep. `report` records
every grid point with its radii and whether it was pruned; `save` writes it as
`pruned.json` beside the result.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

from bec_jax import algorithms
from bec_jax.files import write_json
from bec_jax.prediction.spec import SweepSpec

METHODS = ("theory",)
PRUNED_FILE = "pruned.json"
# The margin (see the module docstring): the mean-square radius from which
# every point measured diverged run by run, with room, and the fraction of the
# RMS rate at which a pruned point's runs are taken to grow.
MIN_RADIUS = 5.0
SAMPLE_RATE_RATIO = 0.05


class Pruning(NamedTuple):
    """What `prune` decided.

    Attributes:
      spec: the sweep to run: the grid's points less the pruned ones (the
        spec itself when none is pruned).
      report: JSON-ready: the method, the rule's numbers, the whole grid's
        spec (`grid_spec`) and the one that runs (`run_spec`), and per grid
        point its values, mean-square radius, mean radius, the analysis's
        verdict and whether it was pruned (`points`).
    """

    spec: SweepSpec
    report: dict

    @property
    def pruned(self) -> list[dict]:
        """The pruned points' records (`report["points"]`), in grid order."""
        return [p for p in self.report["points"] if p["pruned"]]


def check_method(method) -> str:
    """`method` if it is one of `METHODS`; `ValueError` naming `prune` otherwise."""
    if method not in METHODS:
        raise ValueError(f"prune: unknown method {method!r}; known: {', '.join(METHODS)} (the exact "
                         "mean-square analysis)")
    return method


def diverges(radius: float, steps: int, divergence_bound: float) -> bool:
    """The pruning rule: mean-square radius >= `MIN_RADIUS`, and the growth of
    a run at `SAMPLE_RATE_RATIO` of the RMS rate log(radius) / 2 reaches
    `divergence_bound` within `steps` steps (see the module docstring)."""
    if not radius >= MIN_RADIUS:  # NaN too: never pruned on a number that is not one
        return False
    return SAMPLE_RATE_RATIO * 0.5 * math.log(radius) * steps >= math.log(divergence_bound)


def analysable(spec: SweepSpec) -> None:
    """`ValueError` naming `prune` where the exact analysis does not cover the
    sweep: step sizes on a schedule, a sampler it does not model, an algorithm
    with traces (a user's algorithm that is not affine in its state is found
    when its points are analysed)."""
    from bec_jax.theory import mean_square
    if spec.schedule.kind != "constant":
        raise ValueError(f"prune: --prune theory needs constant step sizes (the exact analysis is of the "
                         f"constant-step recursion), but this sweep's schedule is {spec.schedule.kind}")
    if spec.sampler not in mean_square.SAMPLERS:
        raise ValueError(f"prune: the exact analysis models {' and '.join(mean_square.SAMPLERS)} sampling, "
                         f"not {spec.sampler!r}")
    alg = spec.algorithm_def
    if alg.traces:
        covered = [n for n in algorithms.names() if not algorithms.get(n).traces]
        raise ValueError(f"prune: {alg.name} carries traces ({', '.join(alg.traces)}) and the exact mean-square "
                         f"analysis covers one-step linear methods only; --prune theory takes "
                         f"{', '.join(covered)} (or an algorithm of your own whose update is affine in its state)")


def analyse(spec: SweepSpec) -> list[dict]:
    """Per grid point, in grid order: {index, point, mean_square_radius,
    mean_radius, verdict} from `mean_square.mean_square` (float64, the
    sweep's sampler, no stationary moments). `ValueError` naming `prune` and
    the point where the analysis refuses it."""
    from bec_jax.theory import mean_square
    analysable(spec)
    names = spec.algorithm_def.names
    rows = []
    for i, (p, model) in enumerate(zip(spec.grid_points(), spec.point_mdps())):
        hp = {n: v for n, v in p.items() if n in names}
        try:
            ms = mean_square.mean_square(model, spec.algorithm_def, hp, spec.sampler, stationary=False)
        except ValueError as e:
            raise ValueError(f"prune: no exact analysis of {spec.algorithm} on {spec.env} at {_text(p)} "
                             f"(grid point {i}): {e}") from None
        rows.append({"index": i, "point": p, "mean_square_radius": float(ms.radius),
                     "mean_radius": float(ms.mean_radius), "verdict": ms.label})
    return rows


def prune(spec: SweepSpec, method: str = "theory") -> Pruning:
    """The sweep `spec` less the grid points the exact analysis says diverge
    (`diverges`). `ValueError` naming `prune` for an unknown method, a sweep
    the analysis does not cover (`analysable`) and a grid where every point
    is pruned."""
    check_method(method)
    rows = analyse(spec)
    for r in rows:
        r["pruned"] = diverges(r["mean_square_radius"], spec.steps, spec.divergence_bound)
    kept = [r["point"] for r in rows if not r["pruned"]]
    if not kept:
        low = min(r["mean_square_radius"] for r in rows)
        raise ValueError(f"prune: every one of the {len(rows)} grid points is predicted to diverge (mean-square "
                         f"radius {low:.4g} at the least, >= {MIN_RADIUS:g}, their divergence shown within "
                         f"{spec.steps} steps); nothing to run: give smaller step sizes, or leave out --prune to "
                         "run them")
    run = spec if len(kept) == len(rows) else spec.replace(points=kept)
    report = {"method": method, "sampler": spec.sampler, "grid_points": len(rows), "run_points": len(kept),
              "rule": {"min_radius": MIN_RADIUS, "sample_rate_ratio": SAMPLE_RATE_RATIO, "steps": spec.steps,
                       "divergence_bound": spec.divergence_bound},
              "grid_spec": spec.to_dict(), "run_spec": run.to_dict(), "points": rows}
    return Pruning(run, report)


def _text(point: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items())


def listing(report: dict) -> str:
    """The lines `bec-jax run --prune theory` prints: how many points are
    skipped and why, then each skipped point with its radii."""
    rule = report["rule"]
    pruned = [p for p in report["points"] if p["pruned"]]
    margin = (f"past the margin (mean-square radius >= {rule['min_radius']:g}, its divergence shown within "
              f"{rule['steps']} steps)")
    head = (f"--prune theory: of the {report['grid_points']} grid points, the exact mean-square analysis "
            f"({report['sampler']} sampling) puts ")
    if not pruned:
        return head + f"none {margin}; running all {report['grid_points']}"
    lines = [head + f"{len(pruned)} {margin}; skipping {'it' if len(pruned) == 1 else 'them'}, running the "
             f"other {report['run_points']}:"]
    lines += [f"  skipped {_text(p['point'])}: mean-square radius {p['mean_square_radius']:.4g}, mean radius "
              f"{p['mean_radius']:.4g} ({p['verdict']})" for p in pruned]
    return "\n".join(lines)


def save(out_dir: str, report: dict) -> str:
    """Writes `report` as `out_dir/pruned.json` (atomically); returns its path."""
    path = os.path.join(out_dir, PRUNED_FILE)
    write_json(path, report)
    return path


def load(out_dir: str) -> dict | None:
    """The report `save` wrote in `out_dir`, or None where there is none;
    `ValueError` naming the file when it cannot be read."""
    import json
    path = os.path.join(out_dir, PRUNED_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"prune: cannot read {path!r} ({e})") from None
