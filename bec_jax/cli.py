"""The `bec-jax` command line.

    bec-jax run --env ENV --algorithm ALG --alpha LIST [--beta LIST] [--zeta LIST]
                --steps T --seeds N --log-every K [--sampler markov|iid]
                [--schedule constant|robbins_monro] --out DIR
    bec-jax run --config FILE.toml [--out DIR]
    bec-jax run --out DIR --resume          (continue an interrupted run)
    bec-jax reproduce [--quick] [--out DIR] [--overwrite]

Bad input is refused before any work starts, with one line
`bec-jax: error: <field>: <what was given and what is allowed>`, exit status 2,
no traceback, and nothing written.

A run keeps each finished chunk of its grid in DIR/chunks/ as it goes. Ctrl-C
(SIGINT) or SIGTERM stops it after the chunk in progress (a second signal stops
at once), with exit status 130 or 143 and a line saying how to resume;
`--resume` then skips the finished chunks, with results identical bit for bit to
an uninterrupted run. The chunks are removed once the results are written.

Output directories: `run` refuses a non-empty --out unless --overwrite (or
--resume, for a directory holding an interrupted run of the same spec).
`reproduce` refuses one too, except a directory an earlier `bec-jax reproduce`
wrote (its meta.json says so): re-running it overwrites its own output.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import threading
import tomllib

EXIT_USAGE = 2
REPRODUCE_KIND = "bec-jax reproduce"  # the marker in meta.json of `reproduce`'s output

# Command-line option (dest) -> the spec field it sets, as error messages name it.
FIELD_OF_DEST = {"t0": "schedule.t0", "p_alpha": "schedule.p_alpha", "p_beta": "schedule.p_beta",
                 "p_zeta": "schedule.p_zeta"}
SPEC_DESTS = ("env", "algorithm", "alpha", "beta", "zeta", "steps", "seeds", "log_every", "sampler",
              "schedule", "t0", "p_alpha", "p_beta", "p_zeta", "metrics", "dtype", "seed",
              "divergence_bound")
SCHEDULE_DESTS = ("t0", "p_alpha", "p_beta", "p_zeta")


class UsageError(ValueError):
    """Bad input from the command line or a config file."""


def _field_message(message: str) -> str:
    """argparse's error message as one line starting with the field it concerns."""
    m = re.match(r"argument (\S+?): (.*)$", message, re.S)
    if m:
        name, rest = m.groups()
        dest = name.split("/")[0].lstrip("-").replace("-", "_")
        field = FIELD_OF_DEST.get(dest, dest)
        return rest if rest.startswith(f"{field}:") else f"{field}: {rest}"
    m = re.match(r"unrecognized arguments: (.*)$", message, re.S)
    if m:
        first = m.group(1).split()[0]
        if first.startswith("-"):
            return f"{first.lstrip('-').replace('-', '_')}: unknown option {first!r}; see --help"
        return f"arguments: unexpected argument {first!r}; see --help"
    m = re.match(r"the following arguments are required: (.*)$", message, re.S)
    if m:
        name = m.group(1).split(",")[0].strip()
        return f"{name.lstrip('-').replace('-', '_')}: required; see --help"
    return f"arguments: {message}"


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is a `UsageError` (one line naming the field) instead
    of usage text and `sys.exit`."""

    def error(self, message):
        raise UsageError(_field_message(message))


def _int(field: str):
    """An integer; exact-integer float notation (1e6) is accepted."""
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if v == v and abs(v) != float("inf") and v == int(v):
            return int(v)
        raise argparse.ArgumentTypeError(f"{field}: expected an integer, got {text!r}")
    return parse


def _float(field: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field}: expected a number, got {text!r}") from None
    return parse


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


def check_out_dir(out, overwrite: bool, allow=None) -> None:
    """Refuses, without creating anything, an --out that is not a path, exists as
    a file, or is a non-empty directory (unless `overwrite`, or `allow(out)` says
    the directory's contents may be reused)."""
    if not isinstance(out, str) or not out:
        raise UsageError(f"out: expected a directory path, got {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"out: {out!r} exists and is not a directory")
    try:
        nonempty = os.path.isdir(out) and bool(os.listdir(out))
    except OSError as e:
        raise UsageError(f"out: cannot read {out!r} ({e.strerror})") from None
    if nonempty and not overwrite and not (allow is not None and allow(out)):
        raise UsageError(f"out: {out!r} already exists and is not empty; choose another "
                         "directory or pass --overwrite")


def prepare_out_dir(out: str, overwrite: bool, allow=None) -> None:
    """Refuses an existing non-empty directory (unless `overwrite`, or `allow(out)`)
    and one that cannot be written, before any work starts; creates it."""
    check_out_dir(out, overwrite, allow)
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".bec-jax-write-test")
        with open(probe, "w") as f:
            f.write("")
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"out: cannot write to {out!r} ({e.strerror})") from None


def _given(args) -> list[str]:
    """The spec options given on the command line (their defaults are None)."""
    return [d for d in SPEC_DESTS if getattr(args, d, None) is not None]


def _read_config(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise UsageError(f"config: cannot read {path!r} ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"config: {path!r} is not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise UsageError(f"config: {path!r} is not UTF-8 text") from None


def spec_from_args(args):
    """Builds a validated `SweepSpec` from parsed `run` arguments (or the TOML file).

    Options left out take the spec's defaults. With --config, the spec comes from
    the file alone: a spec option also given on the command line is refused (not
    silently ignored). A file's `out = "DIR"` is used unless --out is given.
    """
    from bec_jax.spec import ScheduleSpec, SweepSpec

    given = _given(args)
    if args.config:
        if given:
            d = given[0]
            raise UsageError(f"{FIELD_OF_DEST.get(d, d)}: given both on the command line and by --config "
                             f"{args.config!r}; put it in the config file")
        table = _read_config(args.config)
        out = table.pop("out", None)
        if out is not None and (not isinstance(out, str) or not out):
            raise UsageError(f"out: expected a directory path (a string), got {out!r}")
        if out is not None and not args.out:
            args.out = out
        return SweepSpec.from_dict(table)
    missing = [n for n in ("env", "algorithm", "alpha") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"{missing[0]}: required (or give --config FILE.toml)")
    kind = args.schedule if args.schedule is not None else "constant"
    sched_kw = {d: getattr(args, d) for d in SCHEDULE_DESTS if getattr(args, d) is not None}
    if sched_kw and kind != "robbins_monro":
        d = next(iter(sched_kw))
        raise UsageError(f"schedule.{d}: used only by --schedule robbins_monro, not {kind!r}; "
                         "remove it or add --schedule robbins_monro")
    sched = ScheduleSpec(kind=kind, **sched_kw)
    kw = {d: getattr(args, d) for d in ("steps", "seeds", "log_every", "sampler", "dtype", "seed",
                                        "divergence_bound") if getattr(args, d) is not None}
    if args.metrics is not None:
        kw["metrics"] = tuple(args.metrics)
    spec = SweepSpec(env=args.env, algorithm=args.algorithm, alpha=tuple(args.alpha),
                     beta=tuple(args.beta or ()), zeta=tuple(args.zeta or ()), schedule=sched, **kw)
    for d in sched_kw:
        if d != "t0" and d[2:] not in spec.step_size_names:
            raise UsageError(f"schedule.{d}: {spec.algorithm} does not use {d[2:]} "
                             f"(it uses {', '.join(spec.step_size_names)}); remove it")
    return spec


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM (exit status 128 + the signal number)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _StopOnSignal:
    """While active, the first SIGINT/SIGTERM asks the run to stop after the chunk
    in progress (which is then saved); a second one stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise Interrupted(self.signum)
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def _load_resume_spec(args):
    """`run --out DIR --resume` with no spec options: the interrupted run's spec."""
    from bec_jax.results import ChunkStore
    store = ChunkStore(args.out)
    if not store.exists():
        raise UsageError(f"resume: {args.out!r} holds no interrupted run (no chunks/manifest.json); "
                         "give the spec to start one")
    return store.read_manifest()["spec"]


def _check_resume(args, spec, store) -> dict:
    """The manifest of the interrupted run in --out; `UsageError` naming the first
    field in which the spec or --chunk-size differ from it."""
    m = store.check(spec)
    if args.chunk_size is not None:
        n = m["num_devices"]
        if -(-args.chunk_size // n) * n != m["chunk_size"]:
            raise UsageError(f"chunk_size: the interrupted run used chunks of {m['chunk_size']}, got "
                             f"{args.chunk_size}; resume with the same --chunk-size (or leave it out)")
    return m


def _start_or_resume(args, spec, store):
    """Checks and sets up the chunk store; returns (devices, chunk, done chunks)."""
    import jax
    from bec_jax import sweep
    devices = jax.devices()
    if args.resume and store.exists():
        m = _check_resume(args, spec, store)
        n = m["num_devices"]
        if len(devices) >= n:
            devices = devices[:n]  # the same sharding: bit-identical chunks
        elif m["chunk_size"] % len(devices):
            raise UsageError(f"resume: the interrupted run used {n} devices and chunks of "
                             f"{m['chunk_size']}; this process has {len(devices)} devices")
        # Fewer devices than before is fine: results do not depend on the device count.
        chunk = m["chunk_size"]
        if m["num_chunks"] != sweep.num_chunks(spec, chunk):
            raise UsageError(f"resume: {store.manifest_path!r} is inconsistent; start over with --overwrite")
        return devices, chunk, store.load_done()
    chunk = sweep.plan_chunk(spec, args.chunk_size, len(devices))
    store.start(spec, chunk, sweep.num_chunks(spec, chunk), len(devices), devices[0].platform)
    return devices, chunk, {}


def cmd_run(args) -> int:
    from bec_jax.results import ChunkStore
    if args.resume and args.overwrite:
        raise UsageError("resume: --resume continues the run in --out, --overwrite starts over; give one")
    if args.resume and not args.config and not _given(args):
        if not args.out:
            raise UsageError("out: required (--out DIR)")
        spec = _load_resume_spec(args)
    else:
        spec = spec_from_args(args)
    if not args.out:
        raise UsageError("out: required (--out DIR, or `out = \"DIR\"` in the config file)")
    store = ChunkStore(args.out)
    if args.resume:
        if store.exists():
            _check_resume(args, spec, store)  # before anything is written
        elif os.path.isdir(args.out) and os.listdir(args.out):
            raise UsageError(f"resume: {args.out!r} holds no interrupted run (no chunks/manifest.json) "
                             "and is not empty; choose another directory or pass --overwrite")
    prepare_out_dir(args.out, args.overwrite, allow=lambda d: args.resume)
    if spec.dtype == "float64":
        import jax
        jax.config.update("jax_enable_x64", True)
    enable_compilation_cache()
    from bec_jax import sweep
    devices, chunk, done = _start_or_resume(args, spec, store)
    total = sweep.num_chunks(spec, chunk)
    saved = [len(done)]

    with _StopOnSignal() as stop:
        def on_chunk(i, arrays):
            store.save(i, arrays)
            saved[0] += 1
            if stop.signum is not None and saved[0] < total:
                raise Interrupted(stop.signum)

        try:
            result = sweep.run(spec, chunk_size=chunk, devices=devices, on_chunk=on_chunk, done_chunks=done)
        except Interrupted as e:
            name = signal.Signals(e.signum).name
            print(f"bec-jax: interrupted by {name} after {saved[0]} of {total} chunks; the finished ones "
                  f"are saved in {os.path.join(args.out, 'chunks')}; to continue: bec-jax run --out "
                  f"{shlex.quote(args.out)} --resume", file=sys.stderr)
            return 128 + e.signum
    result.save(args.out)
    store.remove()
    b = result.best_index()
    m = result.meta
    speed = (f", {m['updates_per_s'] / 1e6:.1f} M updates/s" if m["updates_per_s"] else "")
    resumed = f" ({m['resumed_chunks']} of {total} chunks from the interrupted run)" if m["resumed_chunks"] else ""
    print(f"{spec.env} / {spec.algorithm}: {result.num_points} grid points x {spec.seeds} seeds x "
          f"{spec.steps} steps in {m['run_time_s']:.2f} s (+ {m['compile_time_s']:.2f} s compile)"
          f"{speed}{resumed}")
    fm = result.final_mean()[b]
    print(f"best by AUC: {result.point(b)}  final {spec.metrics[0]} = {fm:.4g}, "
          f"diverged fraction {result.diverged_fraction[b]:.2f}")
    print(f"wrote {args.out}/curves.npz, summary.json, meta.json")
    return 0


def is_reproduce_dir(path: str) -> bool:
    """True if `path` holds the output of an earlier `bec-jax reproduce` (its
    meta.json carries the marker; output written before the marker existed is
    recognised by its lemma and specs records)."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and (meta.get("kind") == REPRODUCE_KIND
                                       or {"lemma", "specs", "table"} <= set(meta))


def cmd_reproduce(args) -> int:
    from experiments import paper
    prepare_out_dir(args.out, args.overwrite, allow=is_reproduce_dir)
    enable_compilation_cache()
    paper.reproduce(out_dir=args.out, quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bec-jax", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    # Spec options default to None ("not given"): the spec's defaults apply.
    r = sub.add_parser("run", help="run one step-size sweep", allow_abbrev=False)
    r.add_argument("--config", help="TOML file with the spec's fields (see README)")
    r.add_argument("--env")
    r.add_argument("--algorithm")
    r.add_argument("--alpha", type=_floats("alpha"))
    r.add_argument("--beta", type=_floats("beta"))
    r.add_argument("--zeta", type=_floats("zeta"))
    r.add_argument("--steps", type=_int("steps"), help="default 1000")
    r.add_argument("--seeds", type=_int("seeds"), help="default 50")
    r.add_argument("--log-every", type=_int("log_every"), help="default 10")
    r.add_argument("--sampler", help="markov (default) or iid")
    r.add_argument("--schedule", help="constant (default) or robbins_monro")
    r.add_argument("--t0", type=_float("schedule.t0"),
                   help="robbins_monro: x_t = x (t0/(t+t0))^p (default 100)")
    r.add_argument("--p-alpha", type=_float("schedule.p_alpha"), help="default 1.0")
    r.add_argument("--p-beta", type=_float("schedule.p_beta"), help="default 0.6")
    r.add_argument("--p-zeta", type=_float("schedule.p_zeta"), help="default 0.8")
    r.add_argument("--metrics", type=_names,
                   help="comma-separated: rmscbe (default), rmspcbe, rmspbe, rmsve")
    r.add_argument("--dtype", help="float32 (default) or float64")
    r.add_argument("--seed", type=_int("seed"), help="default 0")
    r.add_argument("--divergence-bound", type=_float("divergence_bound"), help="default 1e6")
    r.add_argument("--chunk-size", type=_int("chunk_size"))
    r.add_argument("--out")
    r.add_argument("--overwrite", action="store_true", help="allow a non-empty --out (start over)")
    r.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out, skipping its finished chunks")
    r.set_defaults(func=cmd_run)

    q = sub.add_parser("reproduce", help="reproduce the paper's experiments", allow_abbrev=False)
    q.add_argument("--quick", action="store_true", help="few seeds, short runs, small grids")
    q.add_argument("--out", default=os.path.join("results", "paper"))
    q.add_argument("--overwrite", action="store_true",
                   help="allow a non-empty --out that an earlier `reproduce` did not write")
    q.set_defaults(func=cmd_reproduce)
    return p


def _error(message) -> int:
    text = " ".join(str(message).split("\n"))
    print(f"bec-jax: error: {text}", file=sys.stderr)
    return EXIT_USAGE


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        return _error(e)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if args.command == "run" and args.chunk_size is not None and args.chunk_size <= 0:
        return _error(f"chunk_size: must be a positive integer, got {args.chunk_size}")
    use_all_cpu_cores()
    try:
        return args.func(args)
    except ValueError as e:  # UsageError and the spec's validation errors
        return _error(e)
    except Interrupted as e:
        print(f"bec-jax: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("bec-jax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
