"""Naik, Wan, Tomar and Sutton, *Reward Centering* (RLC 2024, arXiv
2405.09999), their deep experiments, on the continuing front's network
learners: `bec-jax reproduce --paper reward-centering --deep [--quick]`.

DQN (`dqn`) and DQN with value-based reward centering and their unbiased step
size for rbar (`cdqn_unbiased`: their CDQN with `robust_to_initialization`),
epsilon-greedy with epsilon 0.1, every run a continuing run
(`bec_jax.control.continuing.deep`), as their nonlinear configs set them
(abhisheknaik96/continuing-rl-exps, commit de89d49, `config_files/
{catch,pendulum,puckworld}_nonlinear/`): a tanh network, Adam at lr = alpha, a
buffer of 10,000, an update every 32 steps, the target synced every 128, and
every update one full-batch step over the whole buffer (`batch = full`: their
`_sample_from_buffer` draws min(buffer_size, len(buffer)) transitions; the
configs' batch_size 64 is never read), and the loss's target with rbar from
before the update (`target_rbar = old`: the correction their code means adds 0,
`continuing.deep`). On three tasks:

  Catch      csuite's, observed as its 50-cell board; layers [50, 128, 3];
             offsets -4 .. 4; 15 runs x 80,000 steps.
  Pendulum   the continuing Pendulum of Naik's csuite fork (friction 0.3,
             torques -2, 0, +2, the dense reward -(pi - angle)^2 - 0.1
             velocity^2; `csuite.NAIK_PENDULUM`), observed as (cos, sin,
             velocity / 10); layers [3, 64, 64, 3]; offsets -12 .. 12; 15 x
             100,000.
  PuckWorld  their fork's (`puckworld`), 6 observations; layers [6, 32, 32,
             4]; their cdqn.json's step sizes and etas, 3 runs x 400,000 steps;
             its configs sweep no gamma and no offset (gamma 0.9): here the
             Catch grid's gammas and offsets -4 .. 4, so that the claims can be
             judged.

The full grids (`FULL`): step size 2^-9 .. 2^-3 (7) x eta {0.25 .. 16} (their
eta = 0 is DQN, run as `dqn`) x gamma {0, 0.5, 0.8, 0.9, 0.99, 0.999, 1} x the
offsets. They cost about 10^16 floating-point operations a task: the report
of any run projects their time on this machine (from the update rate it
measured), on one GPU (from its float32 peak, stated as an assumption) and as
a Slurm array, with the commands that run them. The quick form (`QUICK`)
runs in minutes on two CPU cores: two step sizes, eta in {0 (DQN), theirs},
gamma in {0.9, 0.99, 1}, offsets {0, +c}, 5 runs of short runs with a smaller
buffer (still every update a full-batch step over it): a smoke test that the
claims can be read, not evidence.

The claims, judged as the tabular reproduction judges them
(`experiments.reward_centering`: the best step sizes per learner, gamma and
offset by the mean reward rate over the last 50%, 95% t-intervals over runs,
Welch for differences, a tolerance of 5% of the best reward rate's size):

  (i)  with centering the reward rate holds as gamma -> 1, DQN's falls;
  (ii) a reward offset hurts DQN, not CDQN.
"""
from __future__ import annotations

import math
import os

from bec_jax.control.continuing import deep, sweep
from bec_jax.control.continuing.csuite import NAIK_PENDULUM
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.experiments import reward_centering as rc
from bec_jax.experiments.reproduction import Reproduction, is_output, sweep_threads
from bec_jax.files import csv_text

KIND = "bec-jax reproduce --paper reward-centering --deep"
EPSILON = 0.1
LEARNERS = ("dqn", "cdqn_unbiased")  # the baseline first (`rc.roles`)
# What their runs computed: one full-batch step over the whole buffer an update, and the
# target with rbar from before the update (their correction adds 0; `continuing.deep`).
NAIK = {"batch": "full", "target_rbar": "old"}
GAMMAS = (0.0, 0.5, 0.8, 0.9, 0.99, 0.999, 1.0)
ALPHAS = tuple(2.0 ** -k for k in range(9, 2, -1))
ETAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

FULL = {
    "catch": {"task_params": {"features": "board"}, "alpha": ALPHAS, "eta": ETAS, "gamma": GAMMAS,
              "offset": (-4.0, -2.0, 0.0, 2.0, 4.0), "seeds": 15, "steps": 80_000},
    "pendulum": {"task_params": dict(NAIK_PENDULUM), "alpha": ALPHAS, "eta": ETAS, "gamma": GAMMAS,
                 "offset": (-12.0, -6.0, 0.0, 6.0, 12.0), "seeds": 15, "steps": 100_000},
    "puckworld": {"task_params": {}, "alpha": (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1),
                  "eta": (0.003, 0.01, 0.03, 0.1), "gamma": GAMMAS, "offset": (-4.0, -2.0, 0.0, 2.0, 4.0),
                  "seeds": 3, "steps": 400_000},
}
# The quick corner: eta their configs' value for Catch (catch_nonlinear/test.json: 8 at
# step size 2^-6), the middle of their PuckWorld etas, 1 for Pendulum (no config says).
QUICK = {
    "catch": {"alpha": (2.0 ** -8, 2.0 ** -6), "eta": (8.0,), "gamma": (0.9, 0.99, 1.0), "offset": (0.0, 4.0),
              "seeds": 5, "steps": 16_000, "learner_params": {"buffer": 2_000}},
    "pendulum": {"alpha": (2.0 ** -8, 2.0 ** -6), "eta": (1.0,), "gamma": (0.9, 0.99, 1.0), "offset": (0.0, 12.0),
                 "seeds": 5, "steps": 16_000, "learner_params": {"buffer": 2_000}},
    "puckworld": {"alpha": (0.001, 0.003), "eta": (0.03,), "gamma": (0.9, 0.99, 1.0), "offset": (0.0, 4.0),
                  "seeds": 5, "steps": 16_000, "learner_params": {"buffer": 2_000}},
}
# A GPU's float32 rate the projection assumes (an H200's 67 TFLOP/s of plain FP32, NVIDIA's
# figure, at half of it sustained); not measured here: no GPU has run these programs.
GPU_NAME, GPU_FLOPS = "one NVIDIA H200 (assumed 33.5 TFLOP/s sustained: half its 67 TFLOP/s FP32 peak)", 33.5e12
SLURM_PARTS = 64


def settings(task: str, quick: bool, sizes: dict | None = None) -> dict:
    """The grid, run lengths and learner settings of `task` (the quick corner
    with `quick`; `sizes` overrides any of them, the tests' smaller runs)."""
    s = {**FULL[task], **(QUICK[task] if quick else {}), **(sizes or {})}
    s["learner_params"] = {**NAIK, **FULL[task].get("learner_params", {}), **s.get("learner_params", {})}
    return s


def grid_spec(task: str, alg: str, quick: bool = False, sizes: dict | None = None) -> ContinuingSpec:
    """The sweep of `alg` on `task`: alpha (x eta for CDQN) x gamma x reward
    offset, epsilon 0.1, their learner settings."""
    s = settings(task, quick, sizes)
    hp = {"alpha": list(s["alpha"])}
    if alg != "dqn":
        hp["eta"] = list(s["eta"])
    return ContinuingSpec(task=task, task_params=dict(s["task_params"]), algorithm=alg, hyperparameters=hp,
                          epsilon=EPSILON, gamma=list(s["gamma"]), reward_offset=list(s["offset"]),
                          seeds=s["seeds"], steps=s["steps"], learner_params=dict(s["learner_params"]))


def run_all(quick: bool, log=print, pool=None, tasks=None, sizes: dict | None = None) -> dict:
    """{task: {learner: ContinuingResult}}, DQN first; the sweeps two at a time
    with a pool, the largest first."""
    tasks = tuple(FULL) if tasks is None else tuple(tasks)
    jobs = [(t, a, grid_spec(t, a, quick, sizes)) for t in tasks for a in LEARNERS]
    jobs.sort(key=lambda j: -j[2].num_points * j[2].seeds * j[2].steps)

    def one(job):
        t, a, spec = job
        r = sweep.run(spec, progress=False)
        m = r.meta
        log(f"  {t:10s} {a:14s} {r.num_points:4d} points x {r.seeds} runs x {spec.steps:,} steps: compile "
            f"{m['compile_time_s']:.1f} s, run {m['run_time_s']:.1f} s "
            f"({(m.get('steps_per_s') or 0) / 1e3:.1f} k run-steps/s)")
        return t, a, r

    out = {t: {} for t in tasks}
    for t, a, r in (pool.map if pool is not None else map)(one, jobs):
        out[t][a] = r
    return {t: {a: out[t][a] for a in LEARNERS} for t in tasks}


# ------------------------------------------------------------------ cost and projections

def grid_flops(spec: ContinuingSpec) -> float:
    """The floating-point operations of a sweep's products (`deep.sweep_flops`)."""
    return deep.sweep_flops(spec)


def measured_rate(results: list) -> float:
    """The products' floating-point operations per second the sweeps ran at
    (their FLOPs over their run seconds, summed)."""
    flops = sum(grid_flops(r.spec) for r in results)
    secs = sum(r.meta["run_time_s"] for r in results)
    return flops / secs if secs > 0 else math.nan


def projections(rate: float) -> list[dict]:
    """Per task and learner of the full form: its runs, run-steps and FLOPs,
    and its projected hours on this machine at `rate` FLOP/s, on one GPU at
    `GPU_FLOPS`, and per part of a `SLURM_PARTS`-part Slurm array of such
    machines (the same cost split evenly)."""
    rows = []
    for t in FULL:
        for a in LEARNERS:
            spec = grid_spec(t, a)
            f = grid_flops(spec)
            rows.append({"task": t, "learner": a, "points": spec.num_points, "runs": spec.num_points * spec.seeds,
                         "run_steps": spec.num_points * spec.seeds * spec.steps, "flops": f,
                         "cpu_hours": f / rate / 3600, "gpu_hours": f / GPU_FLOPS / 3600,
                         "slurm_part_hours": f / rate / 3600 / SLURM_PARTS})
    return rows


def command(task: str, alg: str) -> str:
    """The `bec-jax continuing` command of the full form's sweep of `alg` on `task`."""
    s = settings(task, False)
    opts = [f"--task {task}"] + [f"--task-param {k}={v}" for k, v in s["task_params"].items()]
    opts += [f"--algorithm {alg}", "--alpha " + ",".join(f"{a:g}" for a in s["alpha"])]
    if alg != "dqn":
        opts.append("--eta " + ",".join(f"{e:g}" for e in s["eta"]))
    opts += ["--gamma " + ",".join(f"{g:g}" for g in s["gamma"]), "--offset " + ",".join(f"{o:g}" for o in s["offset"]),
             "--learner-param batch=full", "--learner-param target_rbar=old", f"--seeds {s['seeds']}",
             f"--steps {s['steps']}",
             f"--out runs/deep_{task}_{alg}"]
    return "bec-jax continuing " + " ".join(opts)


# ------------------------------------------------------------------ report

def _setup(grids: dict, quick: bool) -> list[str]:
    s = ["# Reward centering with networks (Naik, Wan, Tomar and Sutton, RLC 2024), reproduced\n"]
    if quick:
        s.append("**Quick run** (a corner of each grid, 5 runs, short runs, a smaller buffer): a smoke test, "
                 "not evidence.\n")
    s.append("DQN (`dqn`) and DQN with value-based reward centering and Naik et al.'s unbiased step size for rbar "
             "(`cdqn_unbiased`, their CDQN), epsilon 0.1, continuing runs of the network learners "
             "(`bec_jax.control.continuing.deep`): a tanh network, Adam at lr = alpha, the target synced every 128 "
             "steps, an update every 32, each one full-batch step over the whole buffer, and the target with rbar "
             "from before the update, as their code runs (`--learner-param batch=full --learner-param "
             "target_rbar=old`). The learner sees r + c for the reward offset c; every reward rate "
             "below is the task's own. Best settings: per learner, gamma and offset, by the mean reward rate over "
             "the last 50% of the runs that report it. Intervals: 95% Student-t over runs (differences: Welch).\n")
    s.append("| task | layers | buffer | alpha | eta (CDQN) | gamma | offsets | runs x steps |\n"
             "|---|---|---|---|---|---|---|---|")
    for t, by in grids.items():
        sp = by["cdqn_unbiased"].spec
        hp, st = sp.hyperparameters, sp.settings
        s.append(f"| {rc.title(t)} | {list(st.layers)} | {st.buffer:,} | {', '.join(f'{a:g}' for a in hp['alpha'])} "
                 f"| {', '.join(f'{e:g}' for e in hp['eta'])} | {', '.join(f'{g:g}' for g in hp['gamma'])} | "
                 f"{', '.join(f'{o:g}' for o in hp['reward_offset'])} | {sp.seeds} x {sp.steps:,} |")
    s.append("\nPendulum is the continuing Pendulum of Naik's csuite fork (friction 0.3, torques -2, 0, +2, reward "
             "-(pi - angle)^2 - 0.1 velocity^2) and PuckWorld their fork's: both reward costs, so their reward "
             "rates are negative. PuckWorld's configs sweep neither gamma nor offsets; here the Catch grid's.\n")
    return s


def _projection_section(rows: list[dict], rate: float) -> list[str]:
    s = ["## The full form: projected time\n",
         f"The full grids' products, counted from the layer sizes and the buffer (`grid_flops`), at the rate "
         f"this run's sweeps reached on this machine ({rate / 1e9:.1f} GFLOP/s), on {GPU_NAME}, and per part of "
         f"a {SLURM_PARTS}-part Slurm array of machines like this one (`--submit slurm --parts {SLURM_PARTS}`). "
         "A projection, not a measurement: the full grids were not run here.\n",
         "| task | learner | points | runs | run-steps | PFLOP | this machine (h) | one GPU (min) | "
         f"Slurm, {SLURM_PARTS} parts (h each) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s.append(f"| {rc.title(r['task'])} | {r['learner']} | {r['points']:,} | {r['runs']:,} | {r['run_steps']:.3g} "
                 f"| {r['flops'] / 1e15:.2f} | {r['cpu_hours']:,.0f} | {60 * r['gpu_hours']:.1f} | "
                 f"{r['slurm_part_hours']:,.1f} |")
    s.append("\nThe commands (each a `bec-jax continuing` sweep; add `--submit slurm --parts N` for an array):\n")
    s.append("```")
    s += [command(t, a) for t in FULL for a in LEARNERS]
    s.append("```\n")
    return s


def report_markdown(grids, claims, rows, rate, timing, quick) -> str:
    """The report: set-up, claims (i) and (ii) with their tables and verdicts,
    the curves, the projected full form, the time."""
    s = _setup(grids, quick)
    s += rc.gamma_section(claims["gamma"], {})
    s += rc.offset_section(claims["offset"])
    s.append("Learning curves at the largest gamma below 1: ![curves](rc_curves.png)\n")
    s += _projection_section(rows, rate)
    s.append(f"## Time\n\n{timing['device']}: {timing['programs']} programs, trace {timing['trace_s']:.1f} s, "
             f"compile {timing['compile_s']:.1f} s (persistent cache: {timing['cache']}), run "
             f"{timing['run_s']:.1f} s summed over the sweeps (two at a time), {timing['run_steps']:,} run-steps "
             f"in all; total {timing['total_s']:.1f} s.\n")
    return "\n".join(s)


# ------------------------------------------------------------------ entry point

def is_reproduce_dir(path: str) -> bool:
    """True if `path` holds this reproduction's earlier output."""
    return is_output(path, KIND)


def reproduce(out_dir: str = os.path.join("results", "reward_centering_deep"), quick: bool = False, log=print,
              tasks=None, sizes: dict | None = None) -> dict:
    """Runs the deep reward-centering reproduction and writes figures, tables
    and the report to `out_dir` (module docstring). `tasks` and `sizes`
    (hidden from the command line) run a subset at other sizes: the tests'."""
    run = Reproduction(KIND, out_dir, quick, log)
    with sweep_threads() as pool:
        grids = run_all(quick, log, pool, tasks, sizes)
    refs = {t: {"gain": None, "eps_greedy_gain": None} for t in grids}
    best = {t: {a: rc.best_points(r) for a, r in by.items()} for t, by in grids.items()}
    claims = {"gamma": rc.claim_gamma(grids, best, refs), "offset": rc.claim_offset(grids, best, refs)}
    run.save_figures({"rc_gamma": rc.gamma_figure(grids, best, refs),
                      "rc_offset": rc.offset_figure(grids, best, refs),
                      "rc_curves": rc.curves_figure(grids, best, refs)})
    allr = [r for by in grids.values() for r in by.values()]
    rate = measured_rate(allr)
    rows = projections(rate)
    timing = {**run.timing(r.meta for r in allr), "run_steps": sum(r.meta["run_steps"] for r in allr)}
    table = rc.table_rows(grids, best, refs)
    run.write_table(table, rc.table_markdown(table))
    run.write_text("grid.csv", csv_text([x for by in grids.values() for r in by.values() for x in r.summary()]))
    report = report_markdown(grids, claims, rows, rate, timing, quick)
    verdicts = {k: {t: c["verdict"] for t, c in claims[k].items()} for k in claims}
    sweeps = [{"task": r.task, "learner": r.algorithm, "points": r.num_points, "seeds": r.seeds,
               "flops": grid_flops(r.spec),
               **{k: r.meta.get(k) for k in ("compile_time_s", "run_time_s", "run_steps", "steps_per_s")}}
              for r in allr]
    records = {"verdicts": verdicts, "claims": claims, "sweeps": sweeps, "flops_per_s": rate,
               "projections": rows, "table": table,
               "specs": {t: {a: r.spec_dict for a, r in by.items()} for t, by in grids.items()}}
    return run.finish(report, timing, records, rc.table_markdown([x for x in table if x["offset"] == 0.0]))


__all__ = ["FULL", "KIND", "LEARNERS", "QUICK", "grid_flops", "grid_spec", "is_reproduce_dir", "projections",
           "reproduce", "run_all"]
