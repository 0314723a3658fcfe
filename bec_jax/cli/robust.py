"""`--stat iqm|mean|median` of `bec-jax compare` and `plot`, and `bec-jax
compare --profile`: the command line's side of `bec_jax.run.robust` (rliable).

    bec-jax compare DIR... --out FIG.png --stat iqm [--reps N] [--seed S]
    bec-jax compare STUDY --out FIG.png --profile [--stat iqm]
    bec-jax plot DIR... --stat iqm        (adds robust.md, robust.csv, robust.png)
"""
from __future__ import annotations

import os

from bec_jax.cli.args import UsageError, int_arg


def add_options(p, profile: bool = False) -> None:
    """--stat, --reps and --seed (and, for compare, --profile) on a subcommand."""
    from bec_jax.run.robust import REPS, STATS
    p.add_argument("--stat", choices=STATS,
                   help="robust statistics of each run's per-seed scores with rliable's 95%% stratified bootstrap "
                        "intervals: iqm (interquartile mean), mean or median (pip install 'bec_jax[stats]')")
    if profile:
        p.add_argument("--profile", action="store_true",
                       help="performance profiles, the --stat (default iqm) of normalized scores and the "
                            "probability of improvement of each pair of algorithms, across the runs' tasks")
    p.add_argument("--reps", type=int_arg("reps"), default=REPS, metavar="N",
                   help=f"bootstrap resamples (default {REPS})")
    p.add_argument("--seed", type=int_arg("seed"), default=0, help="the bootstrap's seed (default 0)")


def _score_name(results: dict, metric) -> str:
    """What a run's per-seed score is, for labels: "each seed's area under its curve (rmscbe)"."""
    from bec_jax.run import kinds
    r = next(iter(results.values()))
    metric = kinds.of_result(r).figures.check_metric(results, metric)
    return f"each seed's area under its curve ({metric or getattr(r, 'metrics', ('score',))[0]})"


def _interval_lines(est: dict, stat: str, seeds: dict, score: str) -> list[str]:
    from bec_jax.run.robust import stat_name
    return [f"{k}: {stat_name(stat)} of {score} = {p:.6g} " + (
        f"[{lo:.6g}, {hi:.6g}] (95% stratified bootstrap CI, {seeds[k]} seeds)" if seeds[k] > 1 else
        "(1 seed: no confidence interval; run more seeds for one)") for k, (p, lo, hi) in est.items()]


def _save(fig, path: str) -> str:
    from bec_jax.prediction import plotting
    d, name = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(name)
    return plotting.save_figure(fig, d, stem, formats=(ext.lstrip(".") or "png",))[0]


def compare(args, results: dict, select) -> int:
    """`compare --stat` (each run's statistic, along its curve where the kind
    keeps per-seed curves) or `compare --profile` (across tasks)."""
    from bec_jax.run import robust
    robust.require()
    if args.profile:
        return _profile(args, results, select)
    stat = args.stat
    scores = robust.run_scores(results, args.metric, select)
    est = robust.interval_estimates({k: v[:, None] for k, v in scores.items()}, stat, args.reps, args.seed,
                                      over="seeds")
    score = _score_name(results, args.metric)
    for line in _interval_lines(est, stat, {k: len(v) for k, v in scores.items()}, score):
        print(line)
    curves = robust.curve_estimates(results, stat, args.metric, select, args.reps, args.seed)
    if curves is not None:
        fig = robust.curves_figure(curves, stat, f"each seed's curve ({robust.chosen_metric(results, args.metric)})",
                                   args.title or "")
    else:  # per-seed areas only (a prediction run keeps no per-seed curves)
        fig = robust.interval_figure(est, stat, score, args.title or "")
    print(f"wrote {_save(fig, args.out)}")
    return 0


def _profile(args, results: dict, select) -> int:
    from bec_jax.run import robust
    stat = args.stat or "iqm"
    table = robust.by_algorithm(results, args.metric, select)
    taus, prof = robust.profiles(table.scores, args.reps, args.seed)
    agg = robust.interval_estimates(table.scores, stat, args.reps, args.seed)
    poi = robust.improvement(table.scores, args.reps, args.seed)
    runs = {k: v.shape[0] for k, v in table.scores.items()}
    n = len(table.tasks)
    note = " (lower is better here: scores negated, so higher is better)" if table.negated else ""
    print(f"{len(table.scores)} algorithms on {n} tasks ({', '.join(table.tasks)}); scores min-max normalized per "
          f"task over every run{note}")
    for k, (p, lo, hi) in agg.items():
        print(f"{k}: {robust.stat_name(stat)} of normalized scores = {p:.4f} [{lo:.4f}, {hi:.4f}] (95% stratified "
              f"bootstrap CI, {n} tasks x {runs[k]} runs)")
    for (x, y), (p, lo, hi) in poi.items():
        print(f"{x} vs {y}: P({x} > {y}) = {p:.4f} [{lo:.4f}, {hi:.4f}] (95% stratified bootstrap CI, {n} tasks "
              f"x {runs[x]} and {runs[y]} runs)")
    fig = robust.profile_figure(taus, prof, poi, agg, stat, args.title or "")
    print(f"wrote {_save(fig, args.out)}")
    return 0


def plot(args, results: dict, out: str, select) -> list[str]:
    """`plot --stat`: robust.md, robust.csv and robust.png (each run's
    statistic and interval, one kind at a time) in `out`; the paths."""
    from bec_jax.files import atomic_write, csv_text
    from bec_jax.prediction.plotting import rows_markdown, save_figure
    from bec_jax.run import figures, robust
    robust.require()
    groups = figures.by_kind(results)
    tables, paths = [], []
    for kind, rs in groups.items():
        scores = robust.run_scores(rs, args.metric if len(groups) == 1 else None, select)
        est = robust.interval_estimates({k: v[:, None] for k, v in scores.items()}, args.stat, args.reps,
                                          args.seed, over="seeds")
        score = _score_name(rs, args.metric if len(groups) == 1 else None)
        tables.append(robust.rows(est, args.stat, {k: len(v) for k, v in scores.items()}, score))
        name = "robust" if len(groups) == 1 else f"robust_{kind}"
        paths += save_figure(robust.interval_figure(est, args.stat, score), out, name, formats=("png",))
    md = os.path.join(out, "robust.md")
    atomic_write(md, lambda f: f.write("\n".join(rows_markdown(t) for t in tables)))
    csv = os.path.join(out, "robust.csv")
    atomic_write(csv, lambda f: f.write(csv_text([row for t in tables for row in t])))
    return paths + [md, csv]


def check(args) -> None:
    """--profile's and --stat's one-line refusals before anything is read or
    written (rliable missing, --labels with --profile)."""
    if getattr(args, "profile", False) and getattr(args, "labels", None):
        raise UsageError("labels: --profile names algorithms by their runs' algorithm; leave --labels out")
    if args.stat or getattr(args, "profile", False):
        from bec_jax.run import robust
        robust.require()
        robust.check_reps(args.reps)
