"""What every `bec-jax reproduce` shares: one output directory from the first
`meta.json` to the last, the clock, the tables, the report and the figures.

A reproduction module (`paper`, `tdrc`, `control`) computes its paper's
results and renders them as text and figures; `Reproduction` writes them:

    run = Reproduction(KIND, out_dir, quick, log)    # meta.json says "complete": false
    ...                                              # sweeps, analysis
    run.save_figures({"curves": fig})
    timing = run.timing(costs)                       # compile and run seconds summed
    run.write_table(rows, table_markdown(rows))      # table.md, table.csv
    return run.finish(report_markdown(..., timing), timing, {"table": rows, ...})

Every file is written atomically (temporary file + rename). `meta.json` carries
the reproduction's `kind` from the start (with `"complete": false` until the
end), so a later run recognises, and may overwrite, its own earlier output,
even an interrupted one (`is_output`).
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import jax

from bec_jax import provenance
from bec_jax.engine import clock
from bec_jax.files import atomic_write, csv_text, read_meta, write_json
from bec_jax.prediction import plotting

META = "meta.json"
REPORT = "report.md"


def is_output(path: str, kind: str, legacy_keys: frozenset = frozenset()) -> bool:
    """True if `path` holds an earlier output of the reproduction `kind`: its
    meta.json names the kind, or (output written before the kind was recorded)
    has every key of `legacy_keys`."""
    meta = read_meta(path) or {}
    return meta.get("kind") == kind or bool(legacy_keys) and legacy_keys <= set(meta)


def sweep_threads() -> ThreadPoolExecutor:
    """Two threads for the sweeps: XLA compiles outside the GIL, so two programs
    compile at a time on two cores, and compiling is most of a reproduction."""
    return ThreadPoolExecutor(max_workers=2)


def figure_workers(preload: str) -> ProcessPoolExecutor:
    """Two processes that draw and save figures while the sweeps compile
    (matplotlib is slow and single-threaded). They fork from a server process
    that has imported `preload` (the module whose functions they run) once
    (`forkserver`), so no worker pays for the imports again; `spawn` where there
    is no forkserver (Windows). Never a plain fork of this process: forking a
    process that has started JAX is unsafe. They only draw and analyse: JAX
    runs on the CPU there (`cpu_only`), never opening a GPU the sweeps use."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([preload, "matplotlib.figure"])
    else:
        ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(max_workers=2, mp_context=ctx, initializer=cpu_only)


def cpu_only() -> None:
    """Makes this process's JAX use the CPU alone (a worker that draws or
    analyses): a GPU opened here would take its own share of the device's memory
    (75% by default) beside the process that runs the sweeps."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")  # imported by the preload, its backends not yet started


def cost_seconds(costs) -> tuple[float, float]:
    """(compile, run) seconds summed over `costs`: dicts with `compile_time_s`
    and `run_time_s` (a result's `meta`, or a record that kept them)."""
    costs = list(costs)
    return sum(c["compile_time_s"] for c in costs), sum(c["run_time_s"] for c in costs)


class Reproduction:
    """One reproduction's output directory, from its start to `finish`.

    Creating it starts the clock, makes `out_dir`, marks it with a provisional
    meta.json (`kind`, `"complete": false`) and logs the header line."""

    def __init__(self, kind: str, out_dir: str, quick: bool = False, log=print):
        self.kind, self.out_dir, self.quick, self.log = kind, out_dir, quick, log
        self.start, self.clock = time.perf_counter(), clock.snapshot()
        os.makedirs(out_dir, exist_ok=True)
        write_json(self.path(META), {"kind": kind, "complete": False, "quick": quick})
        log(f"{kind}{' --quick' if quick else ''}: {jax.devices()[0].platform} "
            f"x{len(jax.devices())}, writing to {out_dir}")

    def path(self, *parts: str) -> str:
        """A path inside the output directory."""
        return os.path.join(self.out_dir, *parts)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def timing(self, costs) -> dict:
        """The timing record: the machine (named by the first of `costs`, a
        result's meta); the process's import seconds, and the trace and XLA
        compile seconds of every program compiled since the start, summed over
        threads, with the persistent cache's hits (`engine.clock.timing`); the
        run seconds summed over `costs` (see `cost_seconds`) and the total so
        far (`finish` updates it). `sweeps_compile_s`: the sweeps' own compile
        seconds summed over `costs` (trace and compile, as they report them)."""
        costs = list(costs)
        compile_s, run_s = cost_seconds(costs)
        return {"device": provenance.describe(costs[0]), **clock.timing(self.clock, run_s, self.elapsed()),
                "sweeps_compile_s": compile_s}

    def write_text(self, name: str, text: str) -> None:
        """Writes `text` to `name` in the output directory."""
        atomic_write(self.path(name), lambda f: f.write(text))

    def write_table(self, rows: list[dict], markdown: str) -> None:
        """table.md (`markdown`) and table.csv (`rows`, every key a column)."""
        self.write_text("table.md", markdown)
        self.write_text("table.csv", csv_text(rows))

    def save_figures(self, figures: dict) -> None:
        """Writes each {name: figure} as name.png and name.pdf."""
        for name, fig in figures.items():
            plotting.save_figure(fig, self.out_dir, name)

    def finish(self, report: str, timing: dict, records: dict, table: str, how: str = "") -> dict:
        """Writes report.md, then the complete meta.json (kind, machine and
        software, quick, `timing` with the final total, then `records`); logs
        `table` and the closing line (`how`: what the seconds are). Returns the meta."""
        self.write_text(REPORT, report)
        timing["total_s"] = self.elapsed()
        meta = {"kind": self.kind, "complete": True, **provenance.collect(), "quick": self.quick,
                "timing": timing, **records}
        write_json(self.path(META), meta)  # non-finite numbers as null
        self.log(table)
        self.log(f"done in {timing['total_s']:.1f} s ({how}trace {timing['trace_s']:.1f} s, compile "
                 f"{timing['compile_s']:.1f} s (cache {timing['cache']}), run {timing['run_s']:.1f} s); "
                 f"see {self.out_dir}/{REPORT}")
        return meta
