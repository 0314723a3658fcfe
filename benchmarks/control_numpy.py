"""The authors' CliffWalking control experiment as they run it: one algorithm and
one seed at a time, a Python loop over episodes and steps, in plain Python + NumPy.

A re-implementation of GameAI-NJUPT/BEC (commit 4d55a79) `Cliff_Walking/main.py`
and `Cliff_Walking/agent.py`, semantics kept line for line:

  * CliffWalking (Gymnasium `CliffWalking-v0`, non-slippery), written inline: 4x12,
    state = row*12 + col, start 36, goal 47 (terminal), actions 0 up 1 right 2 down
    3 left, off-grid moves stay in place, -1 per step; a step into the cliff (row 3,
    cols 1..10) gives -100 and puts the agent back on 36 without ending the episode.
  * Tabular one-hot features: Q(s, a) = w[a*48 + s]; w, psi (GQ's auxiliary vector)
    and omega start at 0 for every run; omega carries across the episodes of a run.
  * Epsilon-greedy (agent.py:39-46): a uniform u < epsilon explores with an action
    uniform over all 4 (the greedy one included), else argmax Q(s, .) with ties to
    the lowest index (np.argmax). epsilon starts at 0.01 and after every episode is
    multiplied by 0.9992 and floored at 1e-4 (agent.py:28-31, called from main.py:30).
  * An episode ends at the goal or after 1000 steps; the capped transition is
    learned as non-terminal (the update runs before the cap check, agent.py:118-128).
  * Per transition (s, a, r, s', term), everything from the weights before the update:
        a* = argmax_b Q(s', b);  delta = r + (1 - term) gamma Q(s', a*) - Q(s, a);
        p = psi[a*48 + s]
      Q   (agent.py:67-71):  Q(s,a) += alpha delta
      CQ  (agent.py:73-78):  Q(s,a) += alpha (delta - omega); omega += beta (delta - omega)
      GQ  (agent.py:80-90):  Q(s,a) += alpha delta; Q(s',a*) -= alpha p gamma;
                             psi(s,a) += zeta (delta - p)
      CGQ (agent.py:92-103): Q(s,a) += alpha (delta - omega); Q(s',a*) -= alpha p gamma;
                             psi(s,a) += zeta ((delta - omega) - p); omega += beta (delta - omega)
    in that order (the two weight updates are sequential, so when (s',a*) = (s,a)
    both land on the same weight). rho = 1 throughout (`isOffPolicy` is never passed),
    and GQ's correction has no (1 - term) factor: at the goal it lands on the
    (never-bootstrapped) weights of state 47. Products are formed in the authors'
    order, so the arithmetic is bit-for-bit theirs.
  * Metric: steps per episode (the authors' `play_TDC` return value; they save an
    (runs, episodes) array per algorithm and plot the mean over runs). The return
    (sum of rewards) is recorded as well.

Differences, none of which changes a trajectory given the same random numbers:
  * the authors draw from NumPy's global, unseeded generator (`np.random.rand`, then
    `np.random.randint(4)` only when exploring); here a seeded
    `np.random.default_rng(seed)` gives uniforms in the same order of use (one per
    step, a second one, mapped to int(4 u), only when exploring), so runs are
    reproducible;
  * no Gymnasium: the environment is a precomputed table, as Gymnasium's own
    `CliffWalkingEnv.P` is;
  * w and psi are Python lists during a run (the same vectors, w[a*48 + s]; Python
    floats are IEEE doubles like float64, so values are identical) and the dead work
    of the authors' loop is left out (getRho's extra argmax, the list
    comprehensions of get_q). It is written to be fast, not to be a strawman.

Gymnasium's cost. The authors' loop calls `env.step` of `gym.make('CliffWalking-v0')`
(OrderEnforcing + PassiveEnvChecker wrappers; its step also draws from the env's
np_random via `categorical_sample` even when not slippery). Measured with Gymnasium
1.3.0 / NumPy 2.4.6 / Python 3.11 on a 2-core Intel Xeon (shared, load average ~4):
one call costs about 5 us through the wrappers (about 4.2-4.6 us unwrapped), against
about 0.6 us for a whole step of this loop (environment, epsilon-greedy and update),
so Gymnasium alone would add ~8x this loop's time. `main()` measures it again on the
current machine (`--no-gym` skips) and prints the wall time the same steps would take
with it added. Gymnasium 1.2+ has no CliffWalking-v0 (gym.make raises DeprecatedEnv;
v1 is the same class, non-slippery by default), so the measurement falls back to v1.
The authors' own agent.py, run unchanged with Gymnasium (CliffWalking-v1) on the same
machine, took 33.7 s for the whole 4 x 10 x 3000 workload (1.89 M steps, 56 k steps/s),
against about 1.1-1.2 s (1.6-1.7 M steps/s) for this loop; fed the same uniforms,
it produces bit-identical episode lengths, w, psi and omega over 3000 episodes.

    python -m benchmarks.control_numpy --episodes 3000 --seeds 10
    python -m benchmarks.control_numpy --algorithms Q CQ --episodes 500 --seeds 2 --json out.json

API: `run(algorithm, episodes, seed, ...)` -> dict(lengths, returns, steps, w, psi,
omega, epsilon); `cliff_step(s, a)`; `UPDATES[algorithm](w, psi, omega, s, a, r, s2,
term, alpha, beta, zeta, gamma)` -> new omega (w, psi updated in place);
`greedy_path(w)`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as a file: python benchmarks/control_numpy.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import _common

ROWS, COLS = 4, 12
N_STATES = ROWS * COLS  # 48 (Gymnasium's observation_space.n, cliff cells included)
N_ACTIONS = 4
START, GOAL = 36, 47
ALGORITHMS = ("Q", "CQ", "GQ", "CGQ")
# The authors' learningtype numbers (main.py:17, agent.py:118-126) and run order.
AUTHORS_LEARNINGTYPE = {"GQ": 1, "CGQ": 2, "Q": 3, "CQ": 4}
_MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left
_CHUNK = 4096  # uniforms drawn per refill


def cliff_step(s: int, a: int) -> tuple[int, float, bool]:
    """One CliffWalking transition: (next state, reward, terminated)."""
    row, col = divmod(s, COLS)
    dr, dc = _MOVES[a]
    row = min(max(row + dr, 0), ROWS - 1)
    col = min(max(col + dc, 0), COLS - 1)
    if row == ROWS - 1 and 0 < col < COLS - 1:  # the cliff
        return START, -100.0, False
    s2 = row * COLS + col
    return s2, -1.0, s2 == GOAL


def _tables():
    nxt, rew, term = [], [], []
    for s in range(N_STATES):
        out = [cliff_step(s, a) for a in range(N_ACTIONS)]
        nxt.append([o[0] for o in out])
        rew.append([o[1] for o in out])
        term.append([o[2] for o in out])
    return nxt, rew, term


NEXT, REWARD, TERMINAL = _tables()


def _argmax(w: list, s: int) -> int:
    """argmax_a w[a*48 + s], ties to the lowest a (as np.argmax)."""
    best, qb = 0, w[s]
    q = w[N_STATES + s]
    if q > qb:
        best, qb = 1, q
    q = w[2 * N_STATES + s]
    if q > qb:
        best, qb = 2, q
    if w[3 * N_STATES + s] > qb:
        best = 3
    return best


# ---------------------------------------------------------------- the four updates
# Each takes the transition and the state of the learner, updates w and psi in place
# and returns the new omega. Operation order is the authors' (see the module docstring).

def update_q(w, psi, omega, s, a, r, s2, term, alpha, beta, zeta, gamma):
    u = r + (1.0 - term) * gamma * w[_argmax(w, s2) * N_STATES + s2]
    i = a * N_STATES + s
    w[i] += alpha * (u - w[i])
    return omega


def update_cq(w, psi, omega, s, a, r, s2, term, alpha, beta, zeta, gamma):
    u = r + (1.0 - term) * gamma * w[_argmax(w, s2) * N_STATES + s2]
    i = a * N_STATES + s
    delta = u - w[i]
    w[i] += alpha * (delta - omega)
    return omega + beta * (delta - omega)


def update_gq(w, psi, omega, s, a, r, s2, term, alpha, beta, zeta, gamma):
    j = _argmax(w, s2) * N_STATES + s2
    u = r + (1.0 - term) * gamma * w[j]
    i = a * N_STATES + s
    delta = u - w[i]
    p = psi[i]
    w[i] += alpha * delta
    w[j] -= alpha * p * gamma
    psi[i] += zeta * (delta - p)
    return omega


def update_cgq(w, psi, omega, s, a, r, s2, term, alpha, beta, zeta, gamma):
    j = _argmax(w, s2) * N_STATES + s2
    u = r + (1.0 - term) * gamma * w[j]
    i = a * N_STATES + s
    delta = u - w[i]
    p = psi[i]
    w[i] += alpha * (delta - omega)
    w[j] -= alpha * p * gamma
    psi[i] += zeta * ((delta - omega) - p)
    return omega + beta * (delta - omega)


UPDATES = {"Q": update_q, "CQ": update_cq, "GQ": update_gq, "CGQ": update_cgq}


# ---------------------------------------------------------------- one run

def run(algorithm: str, episodes: int, seed: int, alpha: float = 0.1, beta: float = 1e-4,
        zeta: float = 0.005, gamma: float = 0.99, eps0: float = 0.01, eps_decay: float = 0.9992,
        eps_min: float = 1e-4, max_steps: int = 1000) -> dict:
    """One run of the authors' CliffWalking experiment (one algorithm, one seed).

    Returns lengths (episodes,) int64 steps per episode (the authors' metric),
    returns (episodes,) float64 sums of rewards, steps (total transitions), and the
    final w (192,), psi (192,), omega and epsilon."""
    upd = UPDATES[algorithm]
    rng = np.random.default_rng(seed)
    w = [0.0] * (N_STATES * N_ACTIONS)
    psi = [0.0] * (N_STATES * N_ACTIONS)
    omega = 0.0
    eps = eps0
    nxt, rew, trm = NEXT, REWARD, TERMINAL
    argmax = _argmax
    lengths = np.zeros(episodes, np.int64)
    returns = np.zeros(episodes, np.float64)
    buf: list = []
    k = n = 0
    total = 0
    for ep in range(episodes):
        s = START
        step = 0
        ret = 0.0
        while True:
            if k == n:
                buf = rng.random(_CHUNK).tolist()
                k, n = 0, _CHUNK
            u = buf[k]
            k += 1
            if u < eps:  # explore: uniform over all actions (np.random.randint(4))
                if k == n:
                    buf = rng.random(_CHUNK).tolist()
                    k, n = 0, _CHUNK
                a = int(buf[k] * N_ACTIONS)
                k += 1
            else:
                a = argmax(w, s)
            s2 = nxt[s][a]
            r = rew[s][a]
            term = trm[s][a]
            step += 1
            ret += r
            omega = upd(w, psi, omega, s, a, r, s2, term, alpha, beta, zeta, gamma)
            if term or step == max_steps:
                break
            s = s2
        lengths[ep] = step
        returns[ep] = ret
        total += step
        eps = max(eps * eps_decay, eps_min)  # agent.newEpisode(), after every episode
    return {"lengths": lengths, "returns": returns, "steps": total, "w": np.array(w),
            "psi": np.array(psi), "omega": omega, "epsilon": eps}


def greedy_path(w, start: int = START, limit: int = 100) -> list[int]:
    """States visited following argmax Q from `start` until the goal (or `limit` steps)."""
    w = list(np.asarray(w, np.float64))
    path, s = [start], start
    for _ in range(limit):
        s, _, term = cliff_step(s, _argmax(w, s))
        path.append(s)
        if term:
            break
    return path


# ---------------------------------------------------------------- Gymnasium's cost

def gym_step_cost(calls: int = 20000) -> dict | None:
    """Seconds per `env.step` of Gymnasium's CliffWalking (through gym.make's wrappers
    and unwrapped), with the same random action sequence; None without Gymnasium."""
    try:
        import warnings

        import gymnasium as gym
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = gym.make("CliffWalking-v0")
            env_id = "CliffWalking-v0"
        except gym.error.Error:  # Gymnasium >= 1.2: DeprecatedEnv; v1 is the same class
            env = gym.make("CliffWalking-v1")
            env_id = "CliffWalking-v1"
    actions = np.random.default_rng(0).integers(0, N_ACTIONS, calls).tolist()
    out = {"gymnasium_version": gym.__version__, "env_id": env_id}
    for name, e in (("wrapped", env), ("unwrapped", env.unwrapped)):
        e.reset(seed=0)
        step = e.step
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for a in actions:
                if step(a)[2]:
                    e.reset()
            best = min(best, (time.perf_counter() - t0) / calls)
        out[f"{name}_s_per_step"] = best
    return out


# ---------------------------------------------------------------- the benchmark

def describe(m: dict) -> str:
    ram = _common.fmt_bytes(m.get("ram_bytes"))
    return (f"{m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_usable']} usable), {ram} RAM; "
            f"Python {m['python']}, NumPy {m['numpy_version']}; one process, one core (sequential)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=3000, help="episodes per run (default 3000, the authors')")
    ap.add_argument("--seeds", type=int, default=10, help="runs (seeds 0..N-1) per algorithm (default 10)")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS,
                    help="which of Q CQ GQ CGQ (default all four)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the numbers as JSON to PATH")
    ap.add_argument("--no-gym", action="store_true", help="skip timing Gymnasium's env.step")
    args = ap.parse_args(argv)

    machine = _common.machine_info()
    print(describe(machine))
    per_alg = {}
    t_all = time.perf_counter()
    for alg in args.algorithms:
        t0 = time.perf_counter()
        lengths = np.zeros((args.seeds, args.episodes), np.int64)
        steps = 0
        for seed in range(args.seeds):
            r = run(alg, args.episodes, seed)
            lengths[seed] = r["lengths"]
            steps += r["steps"]
        dt = time.perf_counter() - t0
        last = lengths[:, -min(100, args.episodes):]
        per_alg[alg] = {"seconds": dt, "steps": steps, "steps_per_s": steps / dt,
                        "mean_steps_last100": float(last.mean()),
                        "mean_steps_first100": float(lengths[:, :100].mean()),
                        "mean_steps_per_seed_last100": last.mean(axis=1)}
    wall = time.perf_counter() - t_all
    total = sum(v["steps"] for v in per_alg.values())

    print(f"\nCliffWalking, {len(args.algorithms)} algorithms x {args.seeds} seeds x {args.episodes} episodes, "
          "sequential (as the authors' main.py), NumPy loop")
    rows = [[a, f"{v['seconds']:.2f}", v["steps"], _common.fmt_rate(v["steps_per_s"]),
             f"{v['mean_steps_first100']:.1f}", f"{v['mean_steps_last100']:.2f}"] for a, v in per_alg.items()]
    _common.print_table(["algorithm", "seconds", "env steps", "steps/s", "steps/episode, first 100",
                         "steps/episode, last 100"], rows)
    print(f"total: {wall:.2f} s wall, {total} environment steps, {_common.fmt_rate(total / wall)} steps/s")

    gym_cost = None if args.no_gym else gym_step_cost()
    if gym_cost is not None:
        g = gym_cost["wrapped_s_per_step"]
        print(f"Gymnasium {gym_cost['gymnasium_version']} {gym_cost['env_id']} env.step: {g * 1e6:.2f} us/call "
              f"through gym.make's wrappers ({gym_cost['unwrapped_s_per_step'] * 1e6:.2f} us unwrapped), "
              f"vs {wall / total * 1e6:.2f} us per whole step here; with it the same steps would take about "
              f"{wall + g * total:.1f} s")
        gym_cost["estimated_wall_s_with_gym"] = wall + g * total

    if args.json:
        out = {"benchmark": "control_numpy", "timestamp": _common.timestamp(), "machine": machine,
               "workload": {"env": "CliffWalking", "algorithms": args.algorithms, "seeds": args.seeds,
                            "episodes": args.episodes, "alpha": 0.1, "beta": 1e-4, "zeta": 0.005,
                            "gamma": 0.99, "eps0": 0.01, "eps_decay": 0.9992, "eps_min": 1e-4,
                            "max_steps": 1000},
               "wall_s": wall, "steps": total, "steps_per_s": total / wall, "algorithms": per_alg,
               "gymnasium": gym_cost}
        print(f"wrote {_common.write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
