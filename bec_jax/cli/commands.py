"""The `bec-jax` command line: a thin parser that builds a spec and calls the library.

    bec-jax run --env ENV --algorithm ALG --alpha LIST [--NAME LIST ...]
                [--env-param NAME=LIST ...] --steps T --seeds N --log-every K
                [--sampler markov|iid] [--schedule constant|robbins_monro] --out DIR
    bec-jax run --config FILE.toml [--out DIR]
    bec-jax run --out DIR --resume          (continue an interrupted run)
    bec-jax run ... --chunks K/N            (one of N processes sharing --out)
    bec-jax run ... --confirm-seeds N       (the best setting again on N fresh seeds)
    bec-jax run|study|control|continuing ... --submit slurm --parts N [--slurm-option KEY=VALUE ...]
    bec-jax status DIR [--parts N] [--json] (which parts are done, running, failed or missing)
    bec-jax study FILE.toml --out DIR [--resume]
    bec-jax control --task TASK --algorithm ALG --alpha LIST [--beta/--zeta LIST] --episodes E --out DIR
    bec-jax continuing --task TASK --algorithm ALG --alpha LIST [--eta LIST] [--gamma LIST]
                [--offset LIST] --seeds N --steps T --out DIR      (continuing control: the reward rate)
    bec-jax plot DIR... [--out PLOTS]       (runs or studies: curves, sensitivity, table)
    bec-jax compare DIR... --out FIG.png    (their best curves on one figure)
    bec-jax export DIR... --to tensorboard|wandb --out OUT [--per-seed] [--project P] [--overwrite]
    bec-jax reproduce [--paper bec|tdrc|control|reward-centering [--deep]] [--quick] [--out DIR] [--overwrite]
    bec-jax list [environments|algorithms|metrics|tasks|control-algorithms|continuing-tasks|
                  continuing-algorithms] [--json]
    bec-jax --version

ENV is a registered name, an .npz/.toml MDP file or package.module:function; ALG
a registered name or package.module:attribute. Every hyperparameter ALG declares
is a grid axis: `--NAME v1,v2,...` (`--lambda 0,0.5,0.9` for ctd_lambda); every
parameter of ENV too: `--env-param gamma=0.8,0.9` (repeatable).

Bad input is refused before any work starts, with one line
`bec-jax: error: <field>: <what was given and what is allowed>`, exit status 2,
no traceback, and nothing written. Running into a directory, resuming and
stopping on Ctrl-C/SIGTERM are `bec_jax.run.runner`'s; see its docstring. A long
command (run, control, continuing, study, reproduce) that makes no progress for
--stall-timeout seconds (no CPU used, no chunk finished: a deadlock) leaves its
thread stacks in DIR/stall-<pid>.txt and exits with status 75 (`bec_jax.run.watchdog`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys

from bec_jax.cli import cluster as cli_cluster
from bec_jax.cli import export as cli_export
from bec_jax.cli import parser as cli_parser
from bec_jax.cli import robust as cli_robust
from bec_jax.cli.args import (
    UsageError,
    continuing_spec_from_args,
    control_spec_from_args,
    given_options,
    hyper_options,
    join_negative_lists,
    numbers,
    spec_from_args,
    study_defaults,
    value,
)
from bec_jax.files import writing
from bec_jax.run import confirm as run_confirm

EXIT_USAGE = 2

def use_all_cpu_cores(n: int | None = None) -> int | None:
    """Exposes `n` CPU devices to JAX (default: BEC_JAX_CPU_DEVICES, else every
    core) so the sweep shards its grid over them (XLA runs one scanned program per
    device on one thread). Must run before JAX initialises its backends. Returns
    the count set, or None when it was left alone: an XLA_FLAGS device count set by
    the user wins, and live backends cannot change."""
    import jax
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    try:
        n = max(1, int(n or os.environ.get("BEC_JAX_CPU_DEVICES") or os.cpu_count() or 1))
        jax.config.update("jax_num_cpu_devices", n)
    except (ValueError, RuntimeError, AttributeError):
        return None  # backends already initialised, a bad count, or an older JAX
    return n


def select_device(kind: str | None) -> None:
    """Keeps JAX to the CPU (`cpu`) or to a GPU (`gpu`: a `UsageError` in one
    line where JAX has none, instead of JAX's quiet fall-back to the CPU);
    `auto` or None leaves JAX's choice. Before JAX starts its backends."""
    if kind in (None, "auto"):
        return
    import jax
    jax.config.update("jax_platforms", "cpu" if kind == "cpu" else "cuda,rocm")
    try:
        jax.devices()
    except RuntimeError as e:
        jax.config.update("jax_platforms", None)  # the rest of this process keeps JAX's default
        why = "JAX has no GPU backend here" if "not in the list of known backends" in str(e) else str(e).splitlines()[0]
        raise UsageError(f"device: no GPU for --device gpu ({why}); install JAX's CUDA build "
                         "(pip install -e '.[cuda]') or leave --device out") from None


def on_device(meta: dict) -> str:
    """' on gpu (NVIDIA H100 80GB HBM3) x1' / ' on cpu x2' from a result's
    meta (`provenance.devices`); '' where it does not say."""
    if not meta.get("backend"):
        return ""
    kind = "" if meta["backend"] == "cpu" else f" ({meta.get('device')})"
    return f" on {meta['backend']}{kind} x{meta.get('num_devices', 1)}"


def _cache_dir_refusal(path: str) -> str | None:
    """Why JAX's cache must not use `path` (made 0700 if missing), naming the
    fix, or None: it must belong to this user, be writable by it, and not by
    group or others (JAX's cache files, like bec_jax's kept programs, are
    loaded as code)."""
    from bec_jax.engine import program_cache
    q = shlex.quote(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        return f"cannot make {path} ({e.strerror or e}; set BEC_JAX_CACHE_DIR to a directory of your own)"
    why = program_cache.why_untrusted(path, st)
    if why:
        return why
    if not os.access(path, os.W_OK | os.X_OK):  # JAX would warn on every program it could not write
        return f"{path} is not writable (chmod u+wx {q}, or set BEC_JAX_CACHE_DIR to a writable directory)"
    return None


def enable_compilation_cache() -> None:
    """Turns on JAX's persistent compilation cache (repeated runs skip compiling),
    unless BEC_JAX_NO_CACHE is set, in BEC_JAX_CACHE_DIR or ~/.cache/bec_jax/xla.
    A directory of another user, writable by group or others, or not writable
    leaves the cache off, with one line on stderr saying how to fix it. A
    damaged entry of JAX's cache (or of JAX_COMPILATION_CACHE_DIR's) is
    compiled again and replaced (`engine.jax_cache`)."""
    from bec_jax.engine import jax_cache
    jax_cache.mend()
    if os.environ.get("BEC_JAX_NO_CACHE"):
        return
    import jax

    from bec_jax.engine import program_cache
    path = os.environ.get("BEC_JAX_CACHE_DIR")
    if not path:
        path = os.path.join(os.path.expanduser("~"), ".cache", "bec_jax", "xla")
        try:  # the default's parent too: it also holds the secret of kept programs
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        except OSError:
            pass  # reported below, for the cache directory itself
    why = _cache_dir_refusal(path)
    if why:
        program_cache.tell(path, f"the compilation cache is off: {why}")
        return
    jax.config.update("jax_compilation_cache_dir", path)
    # Every program is kept, however fast it compiled: a second run compiles
    # nothing (a small sweep's program may compile under any threshold).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def _timing_note(meta: dict) -> str:
    """': trace 0.31 s, XLA 1.20 s (cache miss); import 1.9 s' from a run's
    meta `timing` (`engine.clock.timing`); '' when nothing compiled."""
    t = meta.get("timing") or {}
    if not t.get("programs"):
        return ""
    imp = f"; import {t['import_s']:.1f} s" if t.get("import_s") is not None else ""
    return f": trace {t['trace_s']:.2f} s, XLA {t['compile_s']:.2f} s (cache {t['cache']}){imp}"


def _watchdog(args, out: str, hint: str):
    """The stall watchdog of a long command (`bec_jax.run.watchdog`), started once
    JAX is set up (its default depends on the backend)."""
    from bec_jax.run import watchdog
    return watchdog.Watchdog(watchdog.timeout_for(args.stall_timeout), out, hint)


def _enable_x64_for(specs) -> None:
    """JAX's 64-bit mode, before anything runs, when any of `specs` asks for float64."""
    if any(s.dtype == "float64" for s in specs):
        import jax
        jax.config.update("jax_enable_x64", True)


def _run_into_dir(spec, args, command: str):
    """`runner.run_to_dir` for `bec-jax run` and `bec-jax control`: 64-bit mode
    and the compilation cache set up, Ctrl-C/SIGTERM stopping within a second
    (the finished work kept), and `--chunks K/N` parts. Returns the result, or the exit status
    when there is nothing more to print (an interrupted run, a finished part)."""
    from bec_jax.run import rundir, runner
    if getattr(args, "submit", None):
        return cli_cluster.submit(args, spec, command)
    if args.confirm_seeds:  # refused before any work, in one line
        run_confirm.check(spec if spec is not None else runner.resume_spec(args.out), args.confirm_seeds, args.chunks)
    _enable_x64_for([spec if spec is not None else runner.resume_spec(args.out)])  # None only when resuming
    enable_compilation_cache()
    part = runner.parse_part(args.chunks) if args.chunks is not None else None
    chunks_dir = os.path.join(args.out, rundir.CHUNKS_DIR)
    again = f"bec-jax {command} --out {shlex.quote(args.out)} --resume"
    rerun = (f"to continue: {again}" if part is None
             else "to continue: run this part again (its saved chunks are kept)")
    with runner.StopOnSignal() as stop, _watchdog(args, args.out, rerun):
        try:
            budget = getattr(args, "memory_budget", None)
            result = runner.run_to_dir(spec, args.out, overwrite=args.overwrite, resume=args.resume,
                                       chunk_size=args.chunk_size, stop=stop, part=part,
                                       **({"memory_budget": budget} if budget is not None else {}))
        except runner.Interrupted as e:
            if e.saved is None:
                raise
            name = signal.Signals(e.signum).name
            inside = ""
            if e.segment is not None:
                i, j, n = e.segment
                inside = f" and chunk {i + 1} after log block {j} of {n} (its state is saved)"
            print(f"bec-jax: interrupted by {name} after {e.saved} of {e.total} chunks{inside}; the finished "
                  f"work is saved in {chunks_dir}; {rerun}", file=sys.stderr)
            return 128 + e.signum
    if part is not None:
        print(f"part {result['part']}: done; {result['chunks_done']} of {result['chunks_total']} chunks are in "
              f"{chunks_dir}. When every part has finished: {again}")
        return 0
    return result


def _spec_or_resume(args, given: bool, build):
    """The spec `build(args)` makes, or None for `--resume` with nothing but --out
    (the interrupted run's spec is used); --out is required either way."""
    if args.resume and not args.config and not given:
        if not args.out:
            raise UsageError("out: required (--out DIR)")
        return None
    spec = build(args)
    if not args.out:
        raise UsageError("out: required (--out DIR, or `out = \"DIR\"` in the config file)")
    return spec


def cmd_run(args) -> int:
    spec = _spec_or_resume(args, given_options(args), spec_from_args)
    result = _run_into_dir(spec, args, "run")
    if isinstance(result, int):
        return result
    spec = result.spec
    b = result.best_index()
    m = result.meta
    speed = (f", {m['updates_per_s'] / 1e6:.1f} M updates/s" if m["updates_per_s"] else "")
    if m["resumed_chunks"] == m["num_chunks"]:
        resumed = f" (assembled from {m['num_chunks']} saved chunks)"
    elif m["resumed_chunks"]:
        resumed = f" ({m['resumed_chunks']} of {m['num_chunks']} chunks from the interrupted run)"
    else:
        resumed = ""
    programs = f", {m['num_programs']} programs" if m["num_programs"] > 1 else ""
    print(f"{spec.env} / {spec.algorithm}: {result.num_points} grid points x {spec.seeds} seeds x "
          f"{spec.steps} steps{on_device(m)} in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s compile{programs}"
          f"{_timing_note(m)}){speed}{resumed}")
    if result.stopped_rung is not None:
        from bec_jax.prediction.plotting import search_line
        print(search_line(result))
    fm = result.final_mean()[b]
    exact = result.exact_verdicts([b])[0]
    print(f"best by AUC: {result.point(b)}  final {spec.metrics[0]} = {fm:.4g}, "
          f"diverged fraction {result.diverged_fraction[b]:.2f}" + (f"; exact: {exact}" if exact else ""))
    print(f"wrote {args.out}/curves.npz, summary.json, summary.csv, meta.json")
    run_confirm.report(result, args.out, args.confirm_seeds)
    return 0


def cmd_control(args) -> int:
    spec = _spec_or_resume(args, bool(args.task or args.algorithm or args.hyper), control_spec_from_args)
    result = _run_into_dir(spec, args, "control")
    if isinstance(result, int):
        return result
    from bec_jax.control.plotting import search_line, search_metric
    from bec_jax.control.results import values_text
    m = result.meta
    print(f"{result.task} / {result.algorithm}: {result.num_points} grid points x {result.seeds} seeds x "
          f"{result.episodes} episodes ({m['logged_steps']:,} steps){on_device(m)} in {m['run_time_s']:.2f} s "
          f"(+ {m['compile_time_s']:.2f} s compile{_timing_note(m)})")
    if search_line(result):
        print(search_line(result))
    stat = search_metric(result)  # a search's rungs' metric; else return
    for values, part in result.by_task_value():  # a task axis is not a setting: the best at each value
        at = f" at {values_text(values)}" if values else ""
        try:
            # By return, the objective on every task (on the built-in ones each step
            # costs -1, so it also ranks by steps per episode; on CartPole more is better).
            b = part.best_index(stat)
            rec = part.summary()[b]
            ci = lambda k: f"[{rec[k + '_ci_low'] or float('nan'):.4g}, {rec[k + '_ci_high'] or float('nan'):.4g}]"
            print(f"best by mean {'return' if stat == 'return' else 'steps'} per episode{at}: {part.point(b)}  "
                  f"{'' if stat == 'return' else 'return '}{rec['auc_return']:.4g} "
                  f"{ci('auc_return')} (95% CI); steps per episode {rec['auc_length']:.4g} {ci('auc_length')}; "
                  f"last 10% of episodes: return {rec['final_return']:.4g}, steps {rec['final_length']:.4g}")
        except ValueError as e:
            print(f"no best setting{at}: {e}")
    print(f"wrote {args.out}/curves.npz, summary.json, summary.csv, meta.json")
    run_confirm.report(result, args.out, args.confirm_seeds, metric=stat)
    return 0


def cmd_continuing(args) -> int:
    """`bec-jax continuing`: one continuing control sweep into --out, and its summary."""
    spec = _spec_or_resume(args, bool(args.task or args.algorithm or args.hyper), continuing_spec_from_args)
    result = _run_into_dir(spec, args, "continuing")
    if isinstance(result, int):
        return result
    m = result.meta
    speed = f", {m['steps_per_s'] / 1e6:.1f} M run-steps/s" if m.get("steps_per_s") else ""
    print(f"{result.task} / {result.algorithm}: {result.num_points} grid points x {result.seeds} seeds x "
          f"{result.blocks * result.block_steps} steps{on_device(m)} in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s "
          f"compile{_timing_note(m)}){speed}")
    from bec_jax.control.continuing.plotting import search_line, summary_line
    print("\n".join(x for x in (search_line(result), summary_line(result)) if x))
    print(f"wrote {args.out}/curves.npz, summary.json, summary.csv, meta.json")
    run_confirm.report(result, args.out, args.confirm_seeds)
    return 0


def cmd_study(args) -> int:
    from bec_jax.run import runner, study
    defaults = study_defaults(args)
    st = study.load(args.file, defaults) if args.file else None
    if st is None and not args.resume:
        raise UsageError("file: required (the study's TOML file), or --resume with --out")
    if args.submit:
        return cli_cluster.submit(args, st, "study")
    known = st or study.saved(args.out)  # a resume without the file: the study saved in --out
    if known is not None:
        _enable_x64_for(spec for _, spec in known.sweeps)
    enable_compilation_cache()
    again = (f"to continue: bec-jax study --out {shlex.quote(args.out)} --resume" if not args.chunks
             else "to continue: run this part again (its saved chunks are kept)")
    with runner.StopOnSignal() as stop, _watchdog(args, args.out, again):
        try:
            study.run(st, args.out, resume=args.resume, overwrite=args.overwrite, stop=stop,
                      confirm_seeds=args.confirm_seeds, chunk_size=args.chunk_size, part=args.chunks)
        except runner.Interrupted as e:
            name = signal.Signals(e.signum).name
            print(f"bec-jax: interrupted by {name}; finished sweeps and chunks are saved in {args.out}; to "
                  f"continue: bec-jax study --out {shlex.quote(args.out)} --resume", file=sys.stderr)
            return 128 + e.signum
    if args.chunks:
        print(f"part {args.chunks}: done. When every part has finished: bec-jax study --out "
              f"{shlex.quote(args.out)} --resume")
        return 0
    print(f"wrote {args.out}/study.json and one directory per sweep")
    return 0


def _open_results(dirs) -> tuple[dict, dict]:
    """({name: result}, {name: its directory}) of run directories and the
    finished sweeps of study directories, each result of its own kind
    (`kinds.load_result`: a prediction or a control sweep)."""
    from bec_jax.files import CURVES_FILE
    from bec_jax.run import kinds, study
    paths = {}
    for d in dirs:
        if not os.path.isdir(d):
            raise UsageError(f"dirs: {d!r} is not a directory")
        if study.is_study_dir(d):
            for name, path in study.sweep_dirs(d).items():
                paths[name if len(dirs) == 1 else f"{os.path.basename(os.path.normpath(d))}/{name}"] = path
        elif os.path.isfile(os.path.join(d, CURVES_FILE)):
            paths[os.path.basename(os.path.normpath(d))] = d
        else:
            raise UsageError(f"dirs: {d!r} holds neither a run (curves.npz) nor a study (study.json)")
    if not paths:
        raise UsageError("dirs: no finished sweep to plot")
    return {k: kinds.load_result(p) for k, p in paths.items()}, paths


def _confirmations(paths: dict) -> dict:
    """{name: the run's confirm.json report} for the runs that have one."""
    from bec_jax.run import runner
    out = {}
    for k, p in paths.items():
        f = os.path.join(p, runner.CONFIRM_FILE)
        if os.path.isfile(f):
            try:
                with open(f) as fh:
                    out[k] = json.load(fh)
            except (OSError, ValueError) as e:
                raise UsageError(f"dirs: cannot read {f!r} ({e})") from None
    return out


def _select(text):
    if not text:
        return None
    sel = {}
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise UsageError(f"select: expected NAME=VALUE,..., got {text!r}")
        sel[k.strip()] = value(v)
    return sel


def cmd_plot(args) -> int:
    from bec_jax.run import figures
    cli_robust.check(args)
    results, paths = _open_results(args.dirs)
    out = args.out or os.path.join(args.dirs[0], "plots")
    with writing("the figures and tables", out):  # a full disk: one line
        written = figures.plot_results(results, out, args.metric, _select(args.select), _confirmations(paths))
        written += cli_robust.plot(args, results, out, _select(args.select)) if args.stat else []
    print(f"wrote {len(written)} files to {out}: " + ", ".join(os.path.basename(p) for p in written))
    return 0


def cmd_compare(args) -> int:
    from bec_jax.prediction import plotting
    from bec_jax.run import figures
    if args.sensitivity:  # every check before anything is read or written: `sensitivity.command`
        from bec_jax.run import sensitivity
        refused = [f for f in ("stat", "profile", "labels", "select") if getattr(args, f)]
        return sensitivity.command(args.dirs, args.out, args.metric, args.reps, args.seed, args.title or "", refused)
    if not args.out:
        raise UsageError("out: required: the figure's file (--out FIG.png)")
    cli_robust.check(args)
    results, _ = _open_results(args.dirs)
    if args.labels:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(results):
            raise UsageError(f"labels: {len(labels)} labels for {len(results)} runs")
        results = dict(zip(labels, results.values()))
    if args.stat or args.profile:
        with writing("the figure", args.out):
            return cli_robust.compare(args, results, _select(args.select))
    fig = figures.compare_figure(results, args.metric, args.title or "", _select(args.select))
    d, name = os.path.split(os.path.abspath(args.out))
    stem, ext = os.path.splitext(name)
    with writing("the figure", args.out):
        paths = plotting.save_figure(fig, d, stem, formats=(ext.lstrip(".") or "png",))
    print(f"wrote {paths[0]}")
    return 0


PAPERS = ("bec", "tdrc", "control", "reward-centering")


def cmd_analyze(args) -> int:
    from bec_jax.cli import analyze
    hyper = {k: numbers(k, v) for k, v in args.hyper.items()}
    env_params = {k: v for k, v in (args.env_param or [])}
    axes = tuple(args.map) if args.map else None
    if axes is not None and len(axes) != 2:
        raise UsageError(f"map: expected two names X,Y, got {','.join(axes)!r}")
    print(analyze.command(args.env, args.algorithm, hyper, env_params, args.sampler, args.out, args.run, axes,
                          args.map_points), end="")
    return 0


def cmd_reproduce(args) -> int:
    import importlib

    from bec_jax.run import rundir
    if args.paper not in PAPERS:
        raise UsageError(f"paper: unknown paper {args.paper!r}; known: {', '.join(PAPERS)}")
    module = {"bec": "paper", "tdrc": "tdrc", "control": "control", "reward-centering": "reward_centering"}
    if args.deep and args.paper != "reward-centering":
        raise UsageError(f"deep: --deep runs the network learners of --paper reward-centering, not {args.paper!r}")
    name = module[args.paper] + ("_deep" if args.deep else "")
    exp = importlib.import_module("bec_jax.experiments." + name)
    out = args.out or os.path.join("results", "paper" if args.paper == "bec" else name)
    enable_compilation_cache()
    again = (f"to start it again: bec-jax reproduce --paper {args.paper}{' --deep' if args.deep else ''}"
             f"{' --quick' if args.quick else ''} --out {shlex.quote(out)}")
    guard = _watchdog(args, out, again)  # a bad BEC_JAX_STALL_TIMEOUT is refused before --out is made
    rundir.prepare_out_dir(out, args.overwrite, allow=exp.is_reproduce_dir)
    if args.mean_square and (args.paper in ("control", "reward-centering") or args.deep):
        raise UsageError("mean_square: --mean-square checks the prediction reproductions (--paper bec or tdrc)")
    with guard:
        exp.reproduce(out_dir=out, quick=args.quick, **({"mean_square": True} if args.mean_square else {}))
    return 0


def cmd_list(args) -> int:
    from bec_jax.cli import catalog
    print(catalog.command(args.what, args.json), end="")
    return 0


def _error(message) -> int:
    text = " ".join(str(message).split("\n"))
    print(f"bec-jax: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def _not_a_callback_failure(record) -> bool:
    return not str(record.msg).endswith(" failed")


def _quiet_callback_failures() -> None:
    """JAX logs a failed host callback's traceback before raising its error; the
    run's one line says what failed (`runner.AlgorithmFailed`), so the log
    records are dropped."""
    import logging
    for name in ("jax._src.callback", "jax._src.debugging"):
        logging.getLogger(name).addFilter(_not_a_callback_failure)  # once: a filter already there is kept


def _forget_failed_callbacks() -> None:
    """A failed host callback's error stays in JAX's runtime tokens, which raise
    it again at exit (tracebacks after the one line); forgotten once reported."""
    try:
        from jax._src import dispatch
        dispatch.runtime_tokens.clear()
    except Exception:  # a private part of JAX: without it only the exit is noisier
        pass


def parse(argv=None):
    """Parsed arguments; `run`'s hyperparameter options (`--NAME LIST`, whatever
    the algorithm declares) land in `args.hyper`."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["continuing"]:  # --offset -8,0,8: a list of negative numbers, not an option
        argv = join_negative_lists(argv, ("--offset", "--q0", "--gamma", "--epsilon"))
    args, extra = parser.parse_known_args(argv)
    args.argv = argv  # what a --submit's parts run again
    if args.command in ("run", "control", "continuing", "analyze"):  # the algorithm's declared hyperparameters: --NAME v1,v2
        args.hyper = hyper_options(extra)
    elif extra:
        tok = extra[0]
        if tok.startswith("-"):
            raise UsageError(f"{tok.lstrip('-').replace('-', '_')}: unknown option {tok!r}; see --help")
        raise UsageError(f"arguments: unexpected argument {tok!r}; see --help")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The `bec-jax` parser (`cli_parser.build_parser`) with this module's commands."""
    commands = {"run": cmd_run, "control": cmd_control, "continuing": cmd_continuing, "study": cmd_study,
                "plot": cmd_plot, "compare": cmd_compare, "reproduce": cmd_reproduce, "analyze": cmd_analyze, "list": cmd_list,
                "status": cli_cluster.cmd_status, "export": cli_export.command}
    return cli_parser.build_parser(commands, __doc__.split("\n\n")[0])


def _leave_if_abandoned(rc):
    """`rc`, unless a stop left a computation running (`engine.waits.abandoned`):
    then the process exits now with `rc`, its streams flushed, instead of waiting
    at interpreter exit for a result nobody will read."""
    from bec_jax.engine import waits
    if waits.abandoned() and isinstance(rc, int):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def main(argv=None) -> int:
    """The `bec-jax` command line: runs the command `argv` names; returns its exit status."""
    try:
        args = parse(argv)
    except UsageError as e:
        return _error(e)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if getattr(args, "chunk_size", None) is not None and args.chunk_size <= 0:
        return _error(f"chunk_size: must be a positive integer, got {args.chunk_size}")
    if getattr(args, "confirm_seeds", None) is not None and args.confirm_seeds < 2:
        return _error(f"confirm_seeds: at least 2 seeds (for an interval), got {args.confirm_seeds}")
    if getattr(args, "chunks", None):
        # Several parts may share one GPU: each takes memory as it needs it
        # instead of JAX's default 75% of the device at start.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    use_all_cpu_cores()
    from bec_jax.engine import clock
    from bec_jax.run.runner import AlgorithmFailed, Interrupted
    clock.note_import()  # meta.json's timing: the start-up before the command's work
    _quiet_callback_failures()
    try:
        if getattr(args, "distributed", None):
            if getattr(args, "chunks", None):
                raise UsageError("chunks: --chunks splits a sweep between independent processes, --distributed "
                                 "joins processes into one run; give one")
            cli_cluster.init_distributed(args.distributed)
        select_device(getattr(args, "device", None))
        rc = args.func(args)
        if getattr(args, "distributed", None):
            cli_cluster.leave_distributed()
        return _leave_if_abandoned(rc)
    except (ValueError, AlgorithmFailed) as e:  # bad input, memory, the user's algorithm: one line
        _forget_failed_callbacks()
        return _error(e)
    except Interrupted as e:
        print(f"bec-jax: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return _leave_if_abandoned(128 + e.signum)
    except KeyboardInterrupt:
        print("bec-jax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
