"""The `bec-jax` command line.

    bec-jax run --env ENV --algorithm ALG --alpha LIST [--beta LIST] [--zeta LIST]
                --steps T --seeds N --log-every K [--sampler markov|iid]
                [--schedule constant|robbins_monro] --out DIR
    bec-jax run --config FILE.toml [--out DIR]
    bec-jax reproduce [--quick] [--out DIR]

Bad input is refused before any work starts, with one line naming the field, and
exit status 2; nothing is written.
"""
from __future__ import annotations

import argparse
import os
import sys
import tomllib

EXIT_USAGE = 2


class UsageError(ValueError):
    """Bad input from the command line or a config file."""


def _floats(field: str):
    def parse(text: str) -> list[float]:
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{field}: expected a comma-separated list of numbers, got {text!r}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"{field}: the list is empty")
        return vals
    return parse


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def use_all_cpu_cores() -> None:
    """Exposes each CPU core as a JAX device so the sweep shards its grid over
    them (XLA runs one scanned program per device on one thread). Must run before
    JAX initialises its backends; BEC_JAX_CPU_DEVICES overrides the count, and an
    XLA_FLAGS device count set by the user wins."""
    import jax
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    n = os.environ.get("BEC_JAX_CPU_DEVICES") or str(os.cpu_count() or 1)
    try:
        jax.config.update("jax_num_cpu_devices", max(1, int(n)))
    except (ValueError, RuntimeError, AttributeError):
        pass  # backends already initialised, or an older JAX: one device


def enable_compilation_cache() -> None:
    """Turns on JAX's persistent compilation cache (repeated runs skip compiling),
    unless BEC_JAX_NO_CACHE is set."""
    if os.environ.get("BEC_JAX_NO_CACHE"):
        return
    import jax
    path = os.environ.get("BEC_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "bec_jax", "xla"))
    try:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    except OSError:
        pass  # a read-only home only costs the cache


def prepare_out_dir(out: str, overwrite: bool) -> None:
    """Refuses an existing non-empty directory (unless `overwrite`) and one that
    cannot be written, before any work starts."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"out: {out!r} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise UsageError(f"out: {out!r} already exists and is not empty; choose another "
                         "directory or pass --overwrite")
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".bec-jax-write-test")
        with open(probe, "w") as f:
            f.write("")
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"out: cannot write to {out!r} ({e.strerror})") from None


def spec_from_args(args):
    """Builds a validated `SweepSpec` from parsed `run` arguments (or the TOML file)."""
    from bec_jax.spec import ScheduleSpec, SweepSpec

    if args.config:
        try:
            with open(args.config, "rb") as f:
                table = tomllib.load(f)
        except OSError as e:
            raise UsageError(f"config: cannot read {args.config!r} ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"config: {args.config!r} is not valid TOML ({e})") from None
        table.pop("out", None) if args.out else None
        if "out" in table:
            args.out = table.pop("out")
        return SweepSpec.from_dict(table)
    missing = [f"--{n.replace('_', '-')}" for n in ("env", "algorithm", "alpha") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"{missing[0].lstrip('-')}: required (or give --config FILE.toml)")
    sched = ScheduleSpec(kind=args.schedule, t0=args.t0, p_alpha=args.p_alpha,
                         p_beta=args.p_beta, p_zeta=args.p_zeta)
    return SweepSpec(env=args.env, algorithm=args.algorithm, alpha=tuple(args.alpha),
                     beta=tuple(args.beta or ()), zeta=tuple(args.zeta or ()),
                     steps=args.steps, seeds=args.seeds, log_every=args.log_every,
                     sampler=args.sampler, schedule=sched, metrics=tuple(args.metrics),
                     dtype=args.dtype, seed=args.seed, divergence_bound=args.divergence_bound)


def cmd_run(args) -> int:
    spec = spec_from_args(args)
    if not args.out:
        raise UsageError("out: required (--out DIR, or `out = \"DIR\"` in the config file)")
    prepare_out_dir(args.out, args.overwrite)
    if spec.dtype == "float64":
        import jax
        jax.config.update("jax_enable_x64", True)
    enable_compilation_cache()
    from bec_jax import sweep
    result = sweep.run(spec, chunk_size=args.chunk_size)
    result.save(args.out)
    b = result.best_index()
    m = result.meta
    print(f"{spec.env} / {spec.algorithm}: {result.num_points} grid points x {spec.seeds} seeds x "
          f"{spec.steps} steps in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s compile), "
          f"{m['updates_per_s'] / 1e6:.1f} M updates/s")
    fm = result.final_mean()[b]
    print(f"best by AUC: {result.point(b)}  final {spec.metrics[0]} = {fm:.4g}, "
          f"diverged fraction {result.diverged_fraction[b]:.2f}")
    print(f"wrote {args.out}/curves.npz, summary.json, meta.json")
    return 0


def cmd_reproduce(args) -> int:
    from experiments import paper
    prepare_out_dir(args.out, overwrite=True)
    enable_compilation_cache()
    paper.reproduce(out_dir=args.out, quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bec-jax", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one step-size sweep")
    r.add_argument("--config", help="TOML file with the spec's fields (see README)")
    r.add_argument("--env")
    r.add_argument("--algorithm")
    r.add_argument("--alpha", type=_floats("alpha"))
    r.add_argument("--beta", type=_floats("beta"))
    r.add_argument("--zeta", type=_floats("zeta"))
    r.add_argument("--steps", type=int, default=1000)
    r.add_argument("--seeds", type=int, default=50)
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--sampler", default="markov")
    r.add_argument("--schedule", default="constant", help="constant or robbins_monro")
    r.add_argument("--t0", type=float, default=100.0, help="robbins_monro: x_t = x (t0/(t+t0))^p")
    r.add_argument("--p-alpha", type=float, default=1.0)
    r.add_argument("--p-beta", type=float, default=0.6)
    r.add_argument("--p-zeta", type=float, default=0.8)
    r.add_argument("--metrics", type=_names, default=["rmscbe"],
                   help="comma-separated: rmscbe (default), rmspcbe, rmspbe, rmsve")
    r.add_argument("--dtype", default="float32")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--divergence-bound", type=float, default=1e6)
    r.add_argument("--chunk-size", type=int)
    r.add_argument("--out")
    r.add_argument("--overwrite", action="store_true", help="allow a non-empty --out")
    r.set_defaults(func=cmd_run)

    q = sub.add_parser("reproduce", help="reproduce the paper's experiments")
    q.add_argument("--quick", action="store_true", help="few seeds, short runs, small grids")
    q.add_argument("--out", default=os.path.join("results", "paper"))
    q.set_defaults(func=cmd_reproduce)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_all_cpu_cores()
    try:
        return args.func(args)
    except ValueError as e:  # UsageError and the spec's validation errors
        print(f"bec-jax: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("bec-jax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
