"""Shared pieces of the benchmark scripts: the standard workload, JAX device set-up,
machine description, peak-memory probes, fresh-subprocess workers and JSON output.

Nothing here starts a JAX computation at import time: the scripts must be able to
set `jax_num_cpu_devices` first.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")
DOCS_DIR = os.path.join(REPO_ROOT, "docs")

# The standard workload (issue 5): the paper's Boyan chain CTDC grid (appendix A),
# 9 x 8 x 8 = 576 points, 50 seeds, 1000 steps, RMSCBE every 10 steps, float32.
# It is experiments.paper.spec_for("boyan_chain", "ctdc") with RMSCBE only (tested).
BOYAN_ALPHA = (1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.3)
BOYAN_BETA = (5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5)
BOYAN_ZETA = (5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5)

# Targets of issue 5 (2-core CPU, standard workload, steady state).
TARGET_UPDATES_PER_S = 300e6
TARGET_SPEEDUP = 3000.0
TARGET_COMPILE_S = 2.0
TARGET_MEMORY_BYTES = 1 << 30


def standard_spec(seeds: int = 50, steps: int = 1000, log_every: int = 10, smoke: bool = False):
    """The standard workload's `SweepSpec` (a corner of it with `smoke`)."""
    from bec_jax.prediction.spec import SweepSpec

    if smoke:
        return SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=(1e-2, 0.3), beta=(0.1, 0.5),
                         zeta=(1e-3, 0.1), seeds=4, steps=100, log_every=10,
                         metrics=("rmscbe",), dtype="float32")
    return SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=BOYAN_ALPHA, beta=BOYAN_BETA,
                     zeta=BOYAN_ZETA, seeds=seeds, steps=steps, log_every=log_every,
                     metrics=("rmscbe",), dtype="float32")


def ctdc_grid_spec(points: int, seeds: int, steps: int, log_every: int = 10):
    """A Boyan-chain CTDC sweep with `points` grid points: alpha log-spaced over the
    paper's range [1e-4, 0.3] (all stable), beta = 0.1, zeta = 0.01."""
    import numpy as np

    from bec_jax.prediction.spec import SweepSpec

    alpha = tuple(float(a) for a in np.geomspace(1e-4, 0.3, points)) if points > 1 else (0.1,)
    return SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=alpha, beta=(0.1,), zeta=(0.01,),
                     seeds=seeds, steps=steps, log_every=min(log_every, steps),
                     metrics=("rmscbe",), dtype="float32")


# ---------------------------------------------------------------- JAX set-up

def use_all_cpu_cores(n: int | None = None) -> int:
    """Exposes `n` (default: BEC_JAX_CPU_DEVICES, else every core) CPU devices to
    JAX through `bec_jax.cli.commands.use_all_cpu_cores`; returns the device count in use."""
    import jax

    from bec_jax.cli.commands import use_all_cpu_cores as _use

    got = _use(n)
    if got is None:
        got = len(jax.devices())
        print(f"note: the CPU device count was set elsewhere (XLA_FLAGS or a live JAX); using {got}",
              file=sys.stderr)
    return got


def configure_cache(cache_dir: str | None) -> None:
    """Persistent compilation cache in `cache_dir` (every compile is cached), or
    none at all (so compile times are cold even if the user set a cache dir)."""
    import jax

    if cache_dir:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    else:
        jax.config.update("jax_enable_compilation_cache", False)


def jax_info() -> dict:
    """JAX's version and devices (from `bec_jax.provenance`)."""
    from bec_jax import provenance

    sw, dev = provenance.software(), provenance.devices()
    return {"jax_version": sw["jax_version"], "jaxlib_version": sw["jaxlib_version"],
            "backend": dev["backend"], "device_kind": dev["device"], "num_devices": dev["num_devices"]}


# ---------------------------------------------------------------- machine

def machine_info() -> dict:
    """The machine (from `bec_jax.provenance`, the one place the library records
    it) plus the usable cores and the load average at the start."""
    from bec_jax import provenance

    m, sw = provenance.machine(), provenance.software()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    mem = m.get("memory_gib")
    return {
        "cpu_model": m["cpu"],
        "cpu_flags": m["cpu_flags"],
        "cpu_cores": m["cpu_count"],
        "cpu_cores_usable": usable,
        "ram_bytes": int(mem * 2**30) if mem else None,
        "platform": m["platform"],
        "python": sw["python"],
        "numpy_version": sw["numpy_version"],
        "load_average_at_start": load_average(),
    }


def load_average() -> list | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


# ---------------------------------------------------------------- memory

def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (VmHWM; ru_maxrss elsewhere)."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def current_rss_bytes() -> int | None:
    kib = _proc_status_kib("VmRSS")
    return None if kib is None else kib * 1024


# ---------------------------------------------------------------- subprocess workers

def run_worker(config: dict, timeout: float = 900.0) -> dict:
    """Runs `benchmarks._worker` in a fresh Python process (so its peak memory is its
    own) and returns the JSON it prints on its last line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the worker decides on the cache itself
    # The configuration goes through stdin: a large grid's spec exceeds argv limits.
    proc = subprocess.run([sys.executable, "-m", "benchmarks._worker", "-"], input=json.dumps(config),
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"benchmark worker failed (exit {proc.returncode}) for {config.get('label')}:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------- output

def finite_mean(a, axis=None):
    """Mean over the finite entries (diverged runs are NaN or inf); NaN if none."""
    import numpy as np

    a = np.asarray(a, float)
    ok = np.isfinite(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, a, 0.0).sum(axis=axis) / ok.sum(axis=axis)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _jsonable(x):
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path: str, obj: dict) -> str:
    """Writes `obj` as indented JSON (atomically); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def result_path(out_dir: str, name: str, smoke: bool) -> str:
    """Where benchmark `name` writes its JSON: `<name>.json`, or `<name>_smoke.json`
    for a smoke run (so a smoke run never overwrites a measured result)."""
    return os.path.join(out_dir, f"{name}_smoke.json" if smoke else f"{name}.json")


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def describe_machine(m: dict, j: dict) -> str:
    ram = fmt_bytes(m.get("ram_bytes"))
    return (f"{m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_usable']} usable), {ram} RAM; "
            f"JAX {j['jax_version']} on {j['num_devices']} {j['backend']} device(s) ({j['device_kind']})")


def print_table(headers: list[str], rows: list[list], out=sys.stdout) -> None:
    """A plain-text table (also valid Markdown)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(headers), file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for r in cells:
        print(line(r), file=out)
