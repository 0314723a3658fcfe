"""The measurement behind `--prune theory`'s margin (`bec_jax.prediction.prune`):
for grid points past the mean-square boundary (radius rho > 1), how fast runs
actually grow. A run's growth rate is the top Lyapunov exponent lambda of its
product of the sampled matrices Gamma(Y) (`mean_square.jump_system`, the neutral
directions factored out as the analysis does), estimated here from long
products in float64 with renormalisation; it is compared with the RMS rate
log(rho) / 2 that the exact analysis gives.

Prints the largest rho whose runs converge (lambda <= 0) and, for radii from 2
to 8, the least ratio lambda / (log(rho) / 2) among the points past it, per
sampler and together; --json FILE keeps every point.

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.prune_margin [--quick] [--json FILE]

The full run (4,410 points past the boundary, about 25 minutes on one core)
gave the numbers in the module docstring of `bec_jax.prediction.prune`: runs
that converge up to radius 1.98 (Markov) and 3.4 (i.i.d.), both the 2-state
TD and SRC; from radius 4 on, lambda >= 0.123 of the RMS rate.
"""
import argparse
import json
import math

import numpy as np

from bec_jax import algorithms, envs
from bec_jax.theory import mean_square as msq

ENVS = ("two_state", "baird", "kolter", "random_mdp", "boyan_chain", "random_walk")
ALGS = ("td", "ctd", "tdc", "ctdc", "gtd2", "tdrc", "src", "vrc")


def lyapunov(system: msq.JumpSystem, steps: int, reps: int, seed: int = 0) -> float:
    """The mean over `reps` sampled trajectories of (1/steps) log |Gamma_T ... Gamma_1 v|."""
    V, _ = msq.neutral_basis(system)
    G = np.einsum("ji,mjk,kl->mil", V, system.gamma, V)  # the analysed directions only
    rng = np.random.default_rng(seed)
    out = []
    rows = [np.flatnonzero(system.src == s) for s in range(system.modes)]
    cdfs = [np.cumsum(system.p[r]) for r in rows]
    for _ in range(reps):
        mode = rng.choice(system.modes, p=system.pi)
        v = rng.normal(size=G.shape[1])
        v /= np.linalg.norm(v)
        total = 0.0
        for u in rng.random(steps):
            r, c = rows[mode], cdfs[mode]
            k = r[min(int(np.searchsorted(c, u * c[-1])), len(r) - 1)]
            v = G[k] @ v
            norm = np.linalg.norm(v)
            if norm == 0.0:  # a sampled Gamma that annihilates: the run is exactly at the fixpoint
                return -math.inf
            total += math.log(norm)
            v /= norm
            mode = system.dst[k]
        out.append(total / steps)
    return float(np.mean(out))


def points(quick: bool):
    alphas = [0.5, 1.0, 1.25, 4.0] if quick else [2.0 ** k for k in range(-8, 3)] + list(np.arange(0.25, 4.01, 0.125))
    for env_name in (("two_state",) if quick else ENVS):
        for alg in (("td",) if quick else ALGS):
            others = [s for s in algorithms.get(alg).step_sizes if s != "alpha"]
            for scale in ((0.1, 1.0) if others else (None,)):
                for a in sorted(set(float(x) for x in alphas)):
                    hp = {"alpha": a, **{o: (scale * a if o == "zeta" else scale) for o in others}}
                    yield env_name, alg, hp


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few points of the 2-state TD, short products")
    ap.add_argument("--json", help="write every point here")
    args = ap.parse_args(argv)
    steps, reps = (500, 2) if args.quick else (3000, 3)
    rows = []
    for sampler in msq.SAMPLERS:
        for env_name, alg, hp in points(args.quick):
            system = msq.jump_system(envs.make(env_name), alg, hp, sampler)
            ms = msq.analyse(system, sampler, stationary=False)
            if not 1.0 < ms.radius < 1e3:
                continue
            lam = lyapunov(system, steps, reps)
            rows.append({"env": env_name, "algorithm": alg, "hyperparameters": hp, "sampler": sampler,
                         "radius": ms.radius, "rms_rate": 0.5 * math.log(ms.radius), "lyapunov": lam})
    for label, sel in [(s, [r for r in rows if r["sampler"] == s]) for s in msq.SAMPLERS] + [("both", rows)]:
        conv = [r["radius"] for r in sel if r["lyapunov"] <= 0]
        print(f"{label}: {len(sel)} points past the boundary; the largest radius whose runs converge: "
              f"{max(conv):.3g}" if conv else f"{label}: {len(sel)} points; none whose runs converge")
        for rho in (2.0, 2.5, 3.0, 4.0, 5.0, 8.0):
            past = [r for r in sel if r["radius"] >= rho]
            if past:
                worst = min(past, key=lambda r: r["lyapunov"] / r["rms_rate"])
                print(f"  radius >= {rho:g}: {len(past)} points, least lambda / RMS rate "
                      f"{worst['lyapunov'] / worst['rms_rate']:.3g} ({worst['env']} {worst['algorithm']} "
                      f"{worst['hyperparameters']}, radius {worst['radius']:.3g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
