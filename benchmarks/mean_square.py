"""Time `bec_jax.theory.mean_square` at one grid point of a few tasks: the per-outcome
recursion (`jump_system`), the second-moment radius by LAPACK and by Arnoldi,
and the whole analysis with the stationary moments. Prints one line per task.

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.mean_square
"""
import time

import numpy as np

from bec_jax import envs
from bec_jax.theory import mean_square as msq

CASES = [("baird", {}, "ctdc", {"alpha": 0.01, "beta": 0.0005, "zeta": 0.05}),
         ("boyan_chain", {}, "ctdc", {"alpha": 0.3, "beta": 0.5, "zeta": 0.001}),
         ("boyan_chain", {"features": "tabular"}, "ctdc", {"alpha": 0.01, "beta": 0.01, "zeta": 0.01}),
         ("boyan_chain", {"features": "tabular"}, "tdrc", {"alpha": 0.01})]


def median_time(f, n: int = 5):
    ts, r = [], None
    for _ in range(n):
        t = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), r


def main() -> None:
    for env_name, params, alg, hp in CASES:
        env = envs.make(env_name, **params)
        msq.mean_square(env, alg, hp)  # compiles the per-outcome evaluator
        tj, system = median_time(lambda: msq.jump_system(env, alg, hp, "markov"))
        V, N = msq.neutral_basis(system)
        n = V.shape[1]
        dim = system.modes * n * (n + 1) // 2
        out = [f"{env_name}{params or ''} {alg}: n={system.size} neutral={N.shape[1]} modes={system.modes} "
               f"symmetric dims={dim}; jump_system {tj * 1e3:.1f} ms"]
        for method in (["dense", "arnoldi"] if dim <= 2000 else ["arnoldi"]):
            t, r = median_time(lambda: msq.analyse(system, "markov", method=method, stationary=False), 3)
            out.append(f"radius[{method}] {t:.3f} s ({r.radius:.12f})")
        t, _ = median_time(lambda: msq.analyse(system, "markov"), 1)
        out.append(f"with stationary moments {t:.3f} s")
        print("; ".join(out), flush=True)


if __name__ == "__main__":
    main()
