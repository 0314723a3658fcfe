"""The `bec-jax` argument parser: one subcommand per `_add_<command>`, declared
here; the commands themselves are `bec_jax.cli.commands`'s, passed in by name."""
from __future__ import annotations

import argparse

from bec_jax import algorithms, envs, schedules
from bec_jax.cli import catalog
from bec_jax.cli import cluster as cli_cluster
from bec_jax.cli import export as cli_export
from bec_jax.cli import prune as cli_prune
from bec_jax.cli import robust as cli_robust
from bec_jax.cli.args import (
    Parser,
    default_of,
    env_param_arg,
    float_arg,
    int_arg,
    learner_param_arg,
    listing,
    names_arg,
    size_arg,
)
from bec_jax.control import algorithms as control_algorithms
from bec_jax.control import tasks as control_tasks
from bec_jax.control.continuing import learners as continuing_learners
from bec_jax.control.continuing import tasks as continuing_tasks
from bec_jax.prediction import sampling
from bec_jax.prediction.spec import ScheduleSpec, SweepSpec
from bec_jax.theory import metrics

DISTRIBUTED_HELP = ("join a run of several processes (hosts) with jax.distributed: 'auto' on Slurm or Open "
                    "MPI, else the coordinator (process 0's HOST:PORT), the number of processes and this "
                    "process's index; every process runs the same command, process 0 writes the files")


STALL_HELP = ("seconds without progress (no CPU used, no chunk finished) after which the command is taken to "
              "hang: it writes its thread stacks to OUT/stall-PID.txt and exits with status 75; 0 turns this off "
              "(default: $BEC_JAX_STALL_TIMEOUT, else 120 on a CPU and off on a GPU)")
CONFIRM_HELP = ("after the sweep, run its best setting (a study: each sweep's) again on N fresh seeds, disjoint "
                "from the ones that chose it, and report those numbers as the result (confirm.json, confirm/)")


METRIC_HELP = ("prediction runs: a logged metric (default: each run's first); control runs: return (default) or "
               "length, the statistic drawn and the one whose area under the curve chooses the best setting")


def add_search(p, score: str) -> None:
    """`--search halving` and its options on subcommand `p`, whose rungs rank
    the points by `score`."""
    p.add_argument("--search", choices=("halving",),
                   help=f"successive halving (every point in one compiled program): each rung ranks the points by "
                        f"{score} and keeps the best 1/rate; the result keeps every point")
    p.add_argument("--halving-rate", type=float_arg("halving_rate"), metavar="ETA", help="with --search: default 3")
    p.add_argument("--rungs", type=int_arg("rungs"), metavar="R",
                   help="with --search: default as many as leave the last rung at least ETA points, "
                        "at most 4 (the first rung then sees at least 1/ETA^3 of the run)")
    p.add_argument("--min-steps", type=int_arg("min_steps"), metavar="S",
                   help="with --search: the first rung's least steps (default one log block)")


def stall_timeout_arg(text: str) -> float:
    """--stall-timeout's value: seconds (or off), checked by the watchdog."""
    from bec_jax.run.watchdog import parse_timeout
    try:
        return parse_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(commands: dict, description: str) -> argparse.ArgumentParser:
    """The `bec-jax` parser: one subcommand per `_add_<command>`, each running
    `commands[name]` (the functions of `bec_jax.cli.commands`), under `description`."""
    p = Parser(prog="bec-jax", description=description, allow_abbrev=False)
    p.add_argument("--version", action="version", version=catalog.version_text())
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_run(sub, commands["run"])
    _add_control(sub, commands["control"])
    _add_continuing(sub, commands["continuing"])
    _add_study(sub, commands["study"])
    _add_plot(sub, commands["plot"])
    _add_compare(sub, commands["compare"])
    _add_reproduce(sub, commands["reproduce"])
    _add_analyze(sub, commands["analyze"])
    _add_list(sub, commands["list"])
    cli_cluster.add_status(sub, commands["status"])
    cli_export.add_parser(sub, commands["export"])
    for name in ("run", "control", "continuing", "study"):
        cli_cluster.add_submit_options(sub.choices[name])
    for name in ("run", "control", "continuing", "study", "reproduce"):
        sub.choices[name].add_argument(
            "--device", choices=("auto", "cpu", "gpu"), default="auto",
            help="where to run: auto (JAX's default: a GPU where JAX has one, else the CPU), cpu, or gpu (an "
                 "error in one line where JAX has none)")
    return p


def _add_run(sub, command) -> None:
    """The `bec-jax run` subcommand and its options."""
    # Spec options default to None ("not given"): the spec's defaults apply.
    r = sub.add_parser("run", help="run one sweep", allow_abbrev=False,
                       epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                              "(e.g. --alpha 0.01,0.1 --beta 0.1 --lambda 0,0.5,0.9). `bec-jax list` shows every "
                              "environment's parameters and every algorithm's hyperparameters and equations.")
    r.add_argument("--config", help="TOML file with the spec's fields (see README)")
    r.add_argument("--env", help=f"{listing(envs.names(), default_of(SweepSpec, 'env'), None)}, an .npz/.toml MDP "
                                 "file or package.module:function")
    r.add_argument("--algorithm", help=f"{listing(algorithms.names(), default_of(SweepSpec, 'algorithm'), None)} "
                                       "or package.module:attribute")
    r.add_argument("--env-param", action="append", type=env_param_arg, metavar="NAME=v1,v2",
                   help="an environment parameter's values, e.g. gamma=0.8,0.9 (repeatable)")
    r.add_argument("--steps", type=int_arg("steps"), help="default 1000")
    r.add_argument("--seeds", type=int_arg("seeds"), help="default 50")
    r.add_argument("--log-every", type=int_arg("log_every"), help="default 10")
    r.add_argument("--sampler", help=listing(sampling.KINDS, default_of(SweepSpec, "sampler")))
    r.add_argument("--schedule", help=listing(schedules.SCHEDULES, default_of(ScheduleSpec, "kind")))
    r.add_argument("--t0", type=float_arg("schedule.t0"),
                   help="robbins_monro: x_t = x (t0/(t+t0))^p (default 100)")
    r.add_argument("--p-alpha", type=float_arg("schedule.p_alpha"),
                   help="default 1.0 (--p-NAME for any step size NAME)")
    r.add_argument("--p-beta", type=float_arg("schedule.p_beta"), help="default 0.6")
    r.add_argument("--p-zeta", type=float_arg("schedule.p_zeta"), help="default 0.8")
    r.add_argument("--metrics", type=names_arg,
                   help="comma-separated: " + listing(metrics.metric_names(), default_of(SweepSpec, "metrics")[0],
                                                       None) + " or package.module:attribute")
    r.add_argument("--dtype", help="float32 (default) or float64")
    r.add_argument("--seed", type=int_arg("seed"), help="default 0")
    r.add_argument("--divergence-bound", type=float_arg("divergence_bound"), help="default 1e6")
    r.add_argument("--chunk-size", type=int_arg("chunk_size"))
    r.add_argument("--memory-budget", type=size_arg, metavar="SIZE",
                   help="device memory one compiled call may use, e.g. 3GB or 500MiB (default: 2 GiB or what "
                        "is free, the less); a larger sweep runs in seed chunks and time segments")
    r.add_argument("--out")
    r.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    r.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out, skipping its finished chunks")
    r.add_argument("--chunks", metavar="K/N",
                   help="compute only the K-th of N disjoint parts of the chunks into --out (for N processes, "
                        "e.g. a job array); then `bec-jax run --out DIR --resume` assembles the result")
    r.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N", help=CONFIRM_HELP)
    r.add_argument("--prune", type=cli_prune.method_arg, metavar="theory",
                   help="skip the grid points that the exact mean-square analysis says diverge, beyond a margin "
                        "(mean-square radius >= 5, its divergence shown within --steps); lists them and writes "
                        "DIR/pruned.json; the result holds the points that ran")
    r.add_argument("--distributed", metavar="auto|HOST:PORT,N,ID", help=DISTRIBUTED_HELP)
    r.add_argument("--stall-timeout", type=stall_timeout_arg, metavar="SECONDS", help=STALL_HELP)
    add_search(r, "the area under the first metric's error curve so far (after --prune theory: of the points left)")
    r.set_defaults(func=cli_prune.recording(command))  # --prune theory: DIR/pruned.json once DIR holds the run


def _add_control(sub, command) -> None:
    """The `bec-jax control` subcommand and its options."""
    c = sub.add_parser("control", help="run one control sweep (epsilon-greedy agents on a control task)",
                       allow_abbrev=False,
                       epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                              "(e.g. --eta 0.1,0.5 for an algorithm of your own that declares eta). `bec-jax list "
                              "tasks` and `bec-jax list control-algorithms` show the tasks' parameters and the "
                              "algorithms' hyperparameters and equations.")
    c.add_argument("--config", help="TOML file with the control spec's fields")
    c.add_argument("--task", help=f"{listing(control_tasks.names(), last=None)} or package.module:function, "
                                  "or gymnax:ENV_ID (any gymnax environment with discrete actions)")
    c.add_argument("--task-param", action="append", type=env_param_arg, metavar="NAME=VALUE",
                   help="a task parameter, e.g. num_tilings=5 (repeatable); several numbers (slip=0,0.2) "
                        "make it a grid axis, in one program where the task's factory takes traced values; "
                        "a gymnax task's features: "
                        "features=tiles|fourier|rbf|package.module:function, their parameters (num_tilings, "
                        "bins; order; centers, sigma) and the box low, high (a number, or one per dimension "
                        "separated by spaces)")
    c.add_argument("--algorithm", help=f"{listing(control_algorithms.names(), last=None)} or "
                                       "package.module:attribute")
    for n in ("alpha", "beta", "zeta"):
        c.add_argument(f"--{n}", metavar="v1,v2,...", help=f"values of {n} (a grid axis)")
    c.add_argument("--episodes", type=int_arg("episodes"), help="episodes per run (default 100)")
    c.add_argument("--seeds", type=int_arg("seeds"), help="default 10")
    c.add_argument("--epsilon", metavar="v1,v2,...", help="default 0.1 (several values: a grid axis)")
    c.add_argument("--epsilon-decay", metavar="v1,v2,...",
                   help="per-episode factor (default 1: constant; the authors use 0.9992; several: a grid axis)")
    c.add_argument("--epsilon-min", metavar="v1,v2,...",
                   help="default 0 (the authors use 1e-4; several values: a grid axis)")
    c.add_argument("--max-episode-steps", type=int_arg("max_episode_steps"), help="default: the task's cap")
    c.add_argument("--max-steps", type=int_arg("max_steps"), help="a run's step budget")
    c.add_argument("--gamma", metavar="v1,v2,...", help="default: the task's (0.99; several values: a grid axis)")
    c.add_argument("--seed", type=int_arg("seed"), help="default 0")
    c.add_argument("--block", type=int_arg("block"), help="steps between divergence checks (default 100)")
    c.add_argument("--dtype", help="float32 (default) or float64")
    c.add_argument("--divergence-bound", type=float_arg("divergence_bound"), help="default 1e6")
    c.add_argument("--reward-shift", type=float_arg("reward_shift"),
                   help="the learner sees r - SHIFT (the constant-shift control for centering; default 0)")
    c.add_argument("--chunk-size", type=int_arg("chunk_size"))
    c.add_argument("--out")
    c.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    c.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    c.add_argument("--chunks", metavar="K/N", help="compute only the K-th of N parts into --out")
    c.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N", help=CONFIRM_HELP)
    c.add_argument("--stall-timeout", type=stall_timeout_arg, metavar="SECONDS", help=STALL_HELP)
    add_search(c, "the mean return per episode finished so far (search.metric = \"length\" in --config: steps)")
    c.set_defaults(func=command)


def _add_continuing(sub, command) -> None:
    """The `bec-jax continuing` subcommand and its options."""
    c = sub.add_parser("continuing", help="run one continuing control sweep (no episodes; the reward rate)",
                       allow_abbrev=False,
                       epilog="Every hyperparameter the learner declares is an option: --NAME v1,v2,... (e.g. "
                              "--alpha 0.1,0.5 --eta 0.1,1 for q_vrc, --beta for cq). `bec-jax list "
                              "continuing-tasks` and `bec-jax list continuing-algorithms` show the tasks' "
                              "parameters and the learners' hyperparameters and equations.")
    c.add_argument("--config", help="TOML file with the continuing spec's fields")
    c.add_argument("--task", help=f"{listing(continuing_tasks.names(), last=None)} or package.module:function")
    c.add_argument("--task-param", action="append", type=env_param_arg, metavar="NAME=VALUE",
                   help="a task parameter, e.g. num_servers=4 (repeatable); several numbers are a grid "
                        "axis (free_probability=0.04,0.06), or the list value of a parameter whose "
                        "default is a list (priorities=1,2,4,8)")
    c.add_argument("--algorithm", help=f"{listing(continuing_learners.names(), last=None)} or "
                                       "package.module:attribute")
    add_search(c, "the reward rate so far")
    c.add_argument("--learner-param", action="append", type=learner_param_arg, metavar="NAME=VALUE",
                   help="a network learner's setting (repeatable): hidden=64,64 (or layers=50,128,3), "
                        "activation=tanh|relu, buffer=10000, batch=64|full, update_period=32, sync_period=128, "
                        "optimizer=adam|sgd|rmsprop; defaults: Naik et al.'s for the task")
    c.add_argument("--epsilon", metavar="v1,v2,...", help="epsilon-greedy's epsilon (default 0.1; several: a grid axis)")
    c.add_argument("--gamma", metavar="v1,v2,...",
                   help="the learner's discount in [0, 1] (default 0.99; several: a grid axis; average-reward "
                        "learners ignore it)")
    c.add_argument("--offset", metavar="v1,v2,...",
                   help="a constant added to every reward the learner sees (default 0; several: a grid axis); "
                        "the reported reward rate is the task's own")
    c.add_argument("--q0", metavar="v1,v2,...", help="initial action values (default 0; several: a grid axis)")
    c.add_argument("--seeds", type=int_arg("seeds"), help="runs per setting (default 10)")
    c.add_argument("--steps", type=int_arg("steps"), help="steps of every run (default 10000)")
    c.add_argument("--log-every", type=int_arg("log_every"),
                   help="steps per log block; steps / log_every must be a multiple of 10 (default steps / 100)")
    c.add_argument("--seed", type=int_arg("seed"), help="default 0")
    c.add_argument("--dtype", help="float32 (default) or float64")
    c.add_argument("--chunk-size", type=int_arg("chunk_size"))
    c.add_argument("--memory-budget", type=size_arg, metavar="SIZE",
                   help="device memory one compiled call may use, e.g. 3GB (default: 2 GiB or what is free)")
    c.add_argument("--out")
    c.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    c.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    c.add_argument("--chunks", metavar="K/N", help="compute only the K-th of N parts into --out")
    c.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N", help=CONFIRM_HELP)
    c.add_argument("--stall-timeout", type=stall_timeout_arg, metavar="SECONDS", help=STALL_HELP)
    c.set_defaults(func=command)


def _add_study(sub, command) -> None:
    """The `bec-jax study` subcommand and its options."""
    st = sub.add_parser("study", help="run several sweeps from one TOML file", allow_abbrev=False)
    st.add_argument("file", nargs="?", help="the study's TOML file (shared defaults, [[sweep]] tables)")
    st.add_argument("--out", required=True)
    st.add_argument("--overwrite", action="store_true")
    st.add_argument("--resume", action="store_true", help="continue the study in --out")
    st.add_argument("--chunk-size", type=int_arg("chunk_size"))
    st.add_argument("--confirm-seeds", type=int_arg("confirm_seeds"), metavar="N", help=CONFIRM_HELP)
    st.add_argument("--chunks", metavar="K/N",
                    help="compute only the K-th of N disjoint parts of every sweep's chunks into --out; then "
                         "`bec-jax study --out DIR --resume` assembles the study")
    st.add_argument("--distributed", metavar="auto|HOST:PORT,N,ID", help=DISTRIBUTED_HELP)
    st.add_argument("--stall-timeout", type=stall_timeout_arg, metavar="SECONDS", help=STALL_HELP)
    add_search(st, "its sweep's front's score (prediction: the error's area so far; control: the return per "
                   "episode; continuing: the reward rate), for every sweep whose own table sets no search")
    st.set_defaults(func=command)


def _add_plot(sub, command) -> None:
    """The `bec-jax plot` subcommand and its options."""
    pl = sub.add_parser("plot", help="figures and a table of runs or studies", allow_abbrev=False)
    pl.add_argument("dirs", nargs="+", help="run directories and/or study directories")
    pl.add_argument("--out", help="where to write (default DIR/plots of the first DIR)")
    pl.add_argument("--metric", help=METRIC_HELP)
    pl.add_argument("--select", metavar="NAME=VALUE,...", help="plot this grid point instead of the best")
    cli_robust.add_options(pl)
    pl.set_defaults(func=command)


def _add_compare(sub, command) -> None:
    """The `bec-jax compare` subcommand and its options."""
    cp = sub.add_parser("compare", help="the best curves of several runs on one figure", allow_abbrev=False)
    cp.add_argument("dirs", nargs="+", help="run directories and/or study directories")
    cp.add_argument("--out", help="the figure's file (.png or .pdf); with --sensitivity a directory (default "
                                  "STUDY/sensitivity)")
    cp.add_argument("--metric", help=METRIC_HELP)
    cp.add_argument("--labels", help="comma-separated legend labels, one per run")
    cp.add_argument("--select", metavar="NAME=VALUE,...")
    cp.add_argument("--title")
    cli_robust.add_options(cp, profile=True)
    cp.add_argument("--sensitivity", action="store_true",
                    help="of one study's sweeps on several tasks: each algorithm's hyperparameter sensitivity Phi "
                         "and effective dimensionality (Adkins et al. 2024), its CHS setting and score (Patterson "
                         "et al. 2024) and sensitivity curves, with bootstrap intervals over seeds (--reps, --seed); "
                         "writes sensitivity.md, .csv and .png into --out")
    cp.set_defaults(func=command)


def _add_reproduce(sub, command) -> None:
    """The `bec-jax reproduce` subcommand and its options."""
    q = sub.add_parser("reproduce", help="reproduce a paper's experiments", allow_abbrev=False)
    q.add_argument("--paper", default="bec",
                   help="bec (Bellman Error Centering, the default; into results/paper), tdrc (Ghiassian et al. "
                        "2020's prediction experiment with the off-policy suite; into results/tdrc), control "
                        "(the authors' control experiments: Q, CQ, GQ, CGQ on four tasks; into results/control) "
                        "or reward-centering (Naik et al. 2024's continuing tabular experiments: Q with and "
                        "without reward centering on Access-Control and TwoChoice; into results/reward_centering)")
    q.add_argument("--deep", action="store_true",
                   help="with --paper reward-centering: Naik et al.'s deep experiments, DQN and CDQN on Catch, "
                        "Pendulum and PuckWorld (into results/reward_centering_deep); the full form projects its "
                        "time, --quick runs a corner in minutes")
    q.add_argument("--quick", action="store_true", help="few seeds, short runs, small grids")
    q.add_argument("--mean-square", action="store_true",
                   help="also every grid point's exact mean-square prediction against its run, with long re-runs "
                        "where the run is too short to tell (minutes more)")
    q.add_argument("--out", default=None, help="output directory (default results/paper or results/<paper>)")
    q.add_argument("--overwrite", action="store_true",
                   help="allow a non-empty --out that an earlier `reproduce` did not write")
    q.add_argument("--stall-timeout", type=stall_timeout_arg, metavar="SECONDS", help=STALL_HELP)
    q.set_defaults(func=command)


def _add_analyze(sub, command) -> None:
    """The `bec-jax analyze` subcommand and its options."""
    an = sub.add_parser("analyze", help="exact mean and mean-square stability of an algorithm on a finite MDP, "
                                        "per grid point (no run)", allow_abbrev=False,
                        epilog="Every hyperparameter the algorithm declares is an option: --NAME v1,v2,... "
                               "(every step size is required).")
    an.add_argument("--env", required=True, help=f"{listing(envs.names(), None, None)}, an .npz/.toml MDP file or "
                                                 "package.module:function")
    an.add_argument("--algorithm", required=True, help=f"{listing(algorithms.names(), None, None)} or "
                                                       "package.module:attribute")
    an.add_argument("--env-param", action="append", type=env_param_arg, metavar="NAME=v1,v2",
                    help="an environment parameter's values, e.g. gamma=0.8,0.9 (repeatable)")
    an.add_argument("--sampler", default="markov", help=listing(sampling.KINDS, "markov"))
    an.add_argument("--out", help="write analysis.md, analysis.json and stability_map.png/.pdf here")
    an.add_argument("--run", metavar="DIR", help="a finished run of the same algorithm: its divergence "
                                                 "fractions go beside the map")
    an.add_argument("--map", type=names_arg, metavar="X,Y",
                    help="the map's two axes (default: the first two options given several values)")
    an.add_argument("--map-points", type=int_arg("map_points"), default=15, help="per axis (default 15)")
    an.set_defaults(func=command)


def _add_list(sub, command) -> None:
    """The `bec-jax list` subcommand and its options."""
    ls = sub.add_parser("list", help="the environments, algorithms, metrics and control tasks, from the registries",
                        allow_abbrev=False)
    ls.add_argument("what", nargs="?", default="all",
                    help=f"all (default), {listing(catalog.SECTIONS)}")
    ls.add_argument("--json", action="store_true", help="print JSON instead of text")
    ls.set_defaults(func=command)
