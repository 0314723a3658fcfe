"""Memory planning: the size of a sweep on every axis, what fits where, and a
clear refusal when something cannot. A front gives `plan` its sweep's size
terms (`Sizes`: its `Engine.plan_memory` passes them) and the same plan
follows for every front; the terms below are those of a front whose programs
log statistics over seeds every log block.

A sweep of G grid points x N seeds x L log points runs as compiled calls of at
most `grid` points x `seeds` seeds x `blocks` log blocks (a *segment*). The model
counts, per call:

  device  G N (C s + 8 + 5 M b)      the learner state s bytes per run, C live copies
                                       in the scan; sampler state, divergence step,
                                       area sums and metric values
        + N (3 K u b + 32)           a log block's uniforms (K steps, u per step) and keys
        + (blocks + 1) G R           the reports: R = (3 M b + 4) bytes of statistics,
                                       or N (M b + 1) per-seed values in a seed chunk
        + G N (2 M b + 4)            the per-seed finals
  host    G_all N (2 M b + 4)        every seed's finals, areas and divergence step
        + (N / seeds) * carry        seed chunks' carried states between calls
        + logs held in memory        (G_all (3 M + 1) L 4 bytes unless streamed to disk)
  disk    an upper bound of the run directory at its fullest (`disk_bytes`), when the
          chunk store (chunks/: every chunk's logs and per-seed arrays) and the result
          files exist at once, before chunks/ is removed: the logs three times (the
          chunks', and the result's, whose .npz also holds the first metric's curves
          under the plain names), twice when streamed; the per-seed arrays twice; the
          grid columns, steps, .npz member overhead, JSON/CSV sidecars and each file's
          last block

with b the dtype's bytes and M the metrics. C is calibrated against XLA's own
buffer assignment (`Compiled.memory_analysis`) by the tests: the estimate is never
below what XLA allocates for the shapes tested, and at most 3 times it.

The budget for one call: `memory_budget` if given; else on a device that
reports its memory (`Device.memory_stats`: a GPU) `DEVICE_FRACTION` of what it
has free, and on a CPU the smaller of `DEFAULT_BUDGET` and half the host's
available memory. On a CPU, with no budget given, a call also keeps its carried
state within `CPU_CACHE_BYTES` per device: a state that stays in cache updates
faster. A segment's update bound scales with the device the same way
(`segment_updates`); its length is then set by its measured time
(`engine.execute`).

Under an address-space limit (`ulimit -v`, usual on HPC nodes) the plan also
counts address space: what the process has mapped already (JAX reserves over a
GB), a CPU call's buffers, the host arrays and the log files the finished run
maps, plus `ADDRESS_MARGIN`; a run that would not fit is refused naming the
field to change, and the default budget of a CPU call is at most half of what
the limit leaves.
"""
from __future__ import annotations

import errno
import os
import shutil
from typing import NamedTuple

import jax
import numpy as np

from bec_jax import files
from bec_jax.engine.buckets import bucket
from bec_jax.files import human

DEFAULT_BUDGET = 2 << 30        # bytes one compiled call may use by default on a CPU
DEVICE_FRACTION = 0.75          # of a device's free memory (`memory_stats`) one call may use by default
SEGMENT_UPDATES = 1_000_000_000  # updates per segment on a CPU: a few seconds
DEVICE_SEGMENT_SCALE = 20       # an accelerator's segments: this many times longer (they take ~0.1 s at CPU length)
BLOCK_OVERHEAD = 5000           # a log block's fixed cost, in updates (the time bound of a segment)
SEGMENT_REPORT_FRACTION = 4     # a segment's reports use at most budget / 4
CPU_CACHE_BYTES = 1_500_000     # carried state per device of one call on a CPU (cache-sized)
MAX_CALLS = 100_000             # more seed chunks than this: refused (the budget is too small to be useful)
LAZY_LOG_BYTES = files.LAZY_LOG_BYTES  # log arrays above this stream to disk (the plan's copy of the format's rule)
ADDRESS_MARGIN = 512 << 20      # address space a run takes beyond the plan (compiler, threads): 250-300 MB measured
MIN_BUDGET = 64 << 20           # the least default budget (below it the plan's own refusals speak)
# The disk bound's fixed terms (`disk_bytes`), measured on runs of 1 to 3 metrics and 6 to 8 grid points with
# room to spare: a file's last block, an .npz member's npy header and zip records (local, central, zip64),
# meta.json + manifest.json + the summary's fixed part, and the summary's JSON + CSV per grid point and metric.
FILE_BLOCK = 4096
NPZ_MEMBER_BYTES = 384
SIDECAR_BYTES = 8 << 10
SIDECAR_POINT_BYTES = 1024


class TooLarge(ValueError):
    """A run that cannot fit: one line naming the field to change and the sizes."""


class OutOfMemory(TooLarge):
    """The device ran out of memory while running (another process took some):
    one line with the advice; `chunk` is the chunk that failed."""

    def __init__(self, message: str, chunk: int | None = None):
        super().__init__(message)
        self.chunk = chunk


def parse_size(text) -> int:
    """'3GB', '500MiB', '2e9' or an int -> bytes; ValueError naming memory_budget."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        n = int(text)
    else:
        s = str(text).strip().replace(" ", "")
        units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
        num = s.rstrip("BbKkMmGgTtIi")
        unit = s[len(num):].upper()
        try:
            n = int(float(num) * units[unit])
        except (ValueError, KeyError):
            raise ValueError(f"memory_budget: expected a size such as 3GB, 500MiB or 2e9 bytes, got {text!r}") from None
    if n <= 0:
        raise ValueError(f"memory_budget: must be positive, got {text!r}")
    return n


# ------------------------------------------------------------------ what is there

def host_available() -> int:
    """Bytes of host memory available now (MemAvailable on Linux; else 8 GB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def device_free(device) -> int | None:
    """Bytes free on `device` by its own allocator's statistics (its limit less
    what is in use), where the backend reports them (GPUs do); None elsewhere
    (a CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # backends without allocator statistics raise or return None
        stats = None
    if stats and stats.get("bytes_limit"):
        return max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    return None


def device_available(device) -> int:
    """Bytes free on `device` (`device_free`), else half the host's available
    memory (a CPU device's memory is the host's, shared with the outputs)."""
    free = device_free(device)
    return free if free is not None else host_available() // 2


def segment_updates(device) -> int:
    """Updates a segment may hold on `device`: `SEGMENT_UPDATES` on a CPU,
    `DEVICE_SEGMENT_SCALE` times that on a device that reports its memory (an
    accelerator), where the CPU's length would be mostly the calls' overhead."""
    return SEGMENT_UPDATES * (DEVICE_SEGMENT_SCALE if device is not None and device_free(device) is not None else 1)


def address_space_limit() -> int | None:
    """The soft limit on this process's address space in bytes (`ulimit -v`,
    usual on HPC login and batch nodes), or None when there is none."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def address_space_used() -> int:
    """Bytes of address space this process has now (VmSize; JAX alone reserves
    over a GB of it), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def address_space_free() -> int | None:
    """Bytes of address space left under the limit, or None when there is no limit."""
    limit = address_space_limit()
    return None if limit is None else limit - address_space_used()


def address_space_note() -> str:
    """What bounds memory here, for an error line: 'address space limited to
    15.3 GiB by ulimit -v (16000000 kB)', or the host memory available."""
    limit = address_space_limit()
    if limit is None:
        return f"no address-space limit (ulimit -v); about {human(host_available())} of host memory is available"
    return f"address space limited to {limit / 2**30:.1f} GiB by ulimit -v ({limit // 1024} kB)"


def is_memory_error(e: BaseException) -> bool:
    """Whether `e` says memory ran out: MemoryError, OSError ENOMEM (a mapping
    refused), or a host callback's error whose last line is one of those."""
    if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
        return True
    last = last_line(e)
    return last.startswith("MemoryError") or "[Errno 12]" in last


def last_line(e: BaseException) -> str:
    """The exception's last line, as a traceback ends: 'ZeroDivisionError: division
    by zero'. An error carried through a JAX host callback ends with the
    original exception's line, which is the one returned."""
    text = str(e).strip()
    if "Traceback (most recent call last)" in text:
        return text.splitlines()[-1].strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def disk_free(path: str) -> int:
    """Bytes free on the file system that holds `path` (or its nearest existing parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return shutil.disk_usage(p).free


# ------------------------------------------------------------------ sizes

class Sizes(NamedTuple):
    """Per-run and per-point sizes of a spec, in bytes (see the module docstring)."""

    item: int          # bytes of the dtype
    metrics: int       # M
    state: int         # the learner state of one run (batched leaves)
    per_run: int       # device bytes per (grid point, seed) in a call
    per_seed: int      # device bytes per seed independent of the grid (uniforms, keys)
    report_stats: int  # bytes per grid point per log point of statistics
    report_seed: int   # bytes per (grid point, seed) per log point of per-seed values
    finals: int        # bytes per (grid point, seed) of finals
    carry: int         # host bytes of a run's carried state between calls
    log_points: int    # L + 1
    block_steps: int = 1  # steps per log block (K)
    per_call: int = 0  # device bytes a call holds whatever its size: the working set of the runs a
                       # front runs in turn, a batch at a time (continuing control's network learners on a CPU)
    # Log points each run keeps among its per-seed results (`finals`), for
    # messages only: a front that logs per run rather than statistics over
    # seeds (continuing control's blocks, control's episodes) says how many
    # there are, where its `log_points` is 1.
    run_logs: int = 0


def logs_text(spec, sz: Sizes) -> str:
    """What a run's logs are, for a message: '101 log points x 8 grid points',
    or where each run keeps its own '100 log points x 2 seeds x 8 grid points'."""
    if sz.run_logs:
        return f"{sz.run_logs} log points x {spec.seeds} seeds x {spec.num_points} grid points"
    return f"{sz.log_points} log points x {spec.num_points} grid points"


def call_bytes(sz: Sizes, grid: int, seeds: int, blocks: int, per_seed: bool) -> int:
    """Device bytes of one call of `grid` points x `seeds` seeds x `blocks` log blocks."""
    report = grid * seeds * sz.report_seed if per_seed else grid * sz.report_stats
    return (sz.per_call + grid * seeds * sz.per_run + seeds * sz.per_seed + (blocks + 1) * report
            + grid * seeds * sz.finals)


def log_bytes(spec, sz: Sizes) -> int:
    """Bytes of the logged arrays of the whole sweep (mean, std, sem per metric, alive)."""
    return spec.num_points * sz.log_points * (3 * sz.metrics * sz.item + 4)


def per_seed_bytes(spec, sz: Sizes) -> int:
    """Bytes of the per-seed arrays of the whole sweep (finals, areas, divergence steps)."""
    return spec.num_points * spec.seeds * sz.finals


def disk_bytes(spec, sz: Sizes, grid: int, lazy: bool, segmented: bool = False) -> int:
    """An upper bound of the bytes the run directory holds at its fullest (see
    the module docstring): the chunk store of `grid`-point chunks beside the
    finished result files. Tested against measured runs: at least the peak and
    at most about 3 times it."""
    G, L, M = spec.num_points, sz.log_points, sz.metrics
    logs, seeds = log_bytes(spec, sz), per_seed_bytes(spec, sz)
    grid_columns = getattr(spec, "grid_arrays", dict)()
    columns = sum(a.nbytes for a in grid_columns.values())
    members = 8 + 5 * M + len(grid_columns)
    chunks = -(-G // max(int(grid), 1))
    store = logs + seeds + chunks * (members * NPZ_MEMBER_BYTES + FILE_BLOCK)  # a chunk's .npz has no steps
    # Before the results are written, a segmented chunk in progress adds its logs so far and the checkpoint
    # of its carried state (gone once the chunk is saved): whichever of the two moments is fuller.
    during = logs * min(int(grid), G) // max(G, 1) + int(grid) * spec.seeds * sz.carry if segmented else 0
    files_out = members if lazy else 1  # a streamed run's logs are one .npy each
    result = (logs if lazy else 2 * logs) + seeds + 8 * L + columns + members * NPZ_MEMBER_BYTES
    sidecars = SIDECAR_BYTES + G * SIDECAR_POINT_BYTES * max(M, 1)
    # The last blocks of the result files, the three sidecars, the manifest, a checkpoint and the directories.
    return store + max(result + sidecars, during) + (files_out + 8) * FILE_BLOCK


# ------------------------------------------------------------------ the plan

class Plan(NamedTuple):
    """How a sweep runs: `grid` points and `seeds` seeds per call, `blocks` log
    blocks per segment (>= L: one segment), the sizes that decided it and the
    budget; `segmented` when the run needs more than one call per grid chunk."""

    grid: int
    seeds: int
    blocks: int
    budget: int
    device_bytes: int
    host_bytes: int
    disk_bytes: int
    lazy: bool
    total_seeds: int
    total_blocks: int

    @property
    def segmented(self) -> bool:
        return self.seeds < self.total_seeds or self.blocks < self.total_blocks


def _seed_chunk(seeds: int, n_devices: int) -> int:
    """A seed chunk's size: split evenly over the devices, at least 2 seeds on
    each. (XLA compiles a batch of one seed differently, dropping its size-1
    axis, which can change the last bit of a metric of a multi-model group.)"""
    return max(2, -(-seeds // n_devices)) * n_devices


def fits_together(specs, n_devices: int = 1, *, sizes, memory_budget: int | None = None, device=None) -> bool:
    """Whether sweeps that each run in one call (see `plan`) fit in one call
    together (`engine.joint.run_many` shares a program between them): their calls'
    device bytes summed within the budget and, on a CPU with the default budget,
    their carried state within `CPU_CACHE_BYTES` per device, as `plan` keeps one.
    `sizes(spec)`: a sweep's `Sizes` (its front's)."""
    device = device if device is not None else jax.devices()[0]
    budget = int(memory_budget) if memory_budget is not None else default_budget(device)
    total = carry = 0
    for spec in specs:
        sz = sizes(spec)
        points = bucket(spec.num_points)  # a sweep's chunk is padded to its bucket size
        total += call_bytes(sz, points, spec.seeds, sz.log_points - 1, False)
        carry += points * spec.seeds * sz.carry
    cache = _cache_bytes(device, n_devices, memory_budget)
    return total <= budget and (cache is None or carry <= cache)


def _cache_bytes(device, n_devices: int, memory_budget: int | None) -> int | None:
    """The carried state one call should keep to, or None for no such limit. On
    a CPU with the default budget, cache-sized: calls whose carried state fits
    the cache run faster than one call of every run (benchmarks/README.md)."""
    if device.platform == "cpu" and memory_budget is None:
        return CPU_CACHE_BYTES * n_devices
    return None


def default_budget(device) -> int:
    """The default device budget of one call: `DEVICE_FRACTION` of what a device
    that reports its memory has free (a GPU's, whatever its size); on a CPU
    `DEFAULT_BUDGET` or half the host's available memory, the less, and under an
    address-space limit at most half of what it leaves."""
    free = device_free(device)
    if free is not None:
        return max(int(free * DEVICE_FRACTION), MIN_BUDGET)
    budget = min(DEFAULT_BUDGET, device_available(device))
    free = address_space_free() if device.platform == "cpu" else None
    if free is not None:  # a CPU device's buffers are this process's address space
        budget = min(budget, max((free - ADDRESS_MARGIN) // 2, MIN_BUDGET))
    return budget


def _seeds_per_call(sz: Sizes, N: int, G_all: int, budget: int, n_devices: int, seed_chunk: int | None) -> int:
    """Seeds per call (see `plan`): every seed if one grid point (per device)
    fits, else the most that do, in balanced seed chunks; `seed_chunk` forces it."""
    one_point = call_bytes(sz, 1, N, 1, False)
    if seed_chunk is not None:
        seeds = int(min(seed_chunk, N))
        if seeds < N:
            seeds = min(N, _seed_chunk(seeds, n_devices))
    elif one_point <= budget:
        seeds = N
    else:
        # Three quarters of the budget for the runs, a quarter for a segment's reports.
        fit = (budget - budget // SEGMENT_REPORT_FRACTION) // (sz.per_run + sz.per_seed + sz.finals
                                                                 + 2 * sz.report_seed)
        if fit < 1:
            need = call_bytes(sz, 1, 1, 1, True)
            raise TooLarge(f"memory_budget: one run of this spec needs about {human(need)} of device memory; "
                           f"the budget is {human(budget)}; raise --memory-budget")
        pieces = -(-N // fit)
        if pieces * G_all > MAX_CALLS:
            raise TooLarge(f"memory_budget: {N} seeds need about {human(one_point)} of device memory per grid "
                           f"point; with {human(budget)} the run would take {pieces * G_all} calls; raise "
                           "--memory-budget or use fewer seeds")
        seeds = min(N, _seed_chunk(-(-N // pieces), n_devices))  # balanced seed chunks
    return seeds


def _blocks_per_segment(sz: Sizes, L: int, grid: int, seeds: int, per_seed: bool, budget: int,
                        segment_blocks: int | None, device=None) -> int:
    """Log blocks per segment (see `plan`): bounded in updates
    (`segment_updates`: seconds of work, which the run then sets by measured time)
    and in report bytes; `segment_blocks` forces it."""
    if segment_blocks is not None:
        blocks = max(1, int(segment_blocks))
    else:
        cost_per_block = grid * seeds * sz.block_steps + BLOCK_OVERHEAD
        by_time = max(1, segment_updates(device) // cost_per_block)
        report = grid * seeds * sz.report_seed if per_seed else grid * sz.report_stats
        by_bytes = max(1, (budget // SEGMENT_REPORT_FRACTION) // max(report, 1))
        blocks = min(by_time, by_bytes)
        if blocks >= L:
            blocks = L
        else:  # equal segments where possible: fewer programs to compile
            blocks = -(-L // -(-L // blocks))
    return min(blocks, L) if L > 0 else 1


def plan(spec, n_devices: int = 1, *, memory_budget: int | None = None, chunk_size: int | None = None,
         seed_chunk: int | None = None, segment_blocks: int | None = None, device=None,
         out: str | None = None, host_budget: int | None = None, sz: Sizes) -> Plan:
    """The plan of `spec` on `n_devices` devices: the largest grid chunk that fits
    the budget with every seed; if one grid point's seeds do not fit, seed chunks;
    segments of at most `segment_updates(device)` updates whose reports fit a quarter of the
    budget. `chunk_size`, `seed_chunk` and `segment_blocks` force a layout
    (results do not depend on it). `TooLarge` (a ValueError, one line naming the
    field) when even one seed of one point does not fit the budget, when the host
    cannot hold the per-seed results, or (with `out`) when the disk cannot hold the files.
    `sz`: the spec's size terms, its front's (`Engine.plan_memory` gives them).
    """
    device = device if device is not None else jax.devices()[0]
    budget = int(memory_budget) if memory_budget is not None else default_budget(device)
    N, L, G_all = spec.seeds, sz.log_points - 1, spec.num_points

    seeds = _seeds_per_call(sz, N, G_all, budget, n_devices, seed_chunk)
    per_seed = seeds < N
    # Grid points per call.
    if chunk_size is not None:
        grid = int(chunk_size)
    elif per_seed:
        grid = 1
    else:
        fixed = N * sz.per_seed + sz.per_call
        per_point = call_bytes(sz, 1, N, 1, False) - fixed
        # Up to the grid's bucket size: a smaller grid's chunk is padded to it (`engine.plan.split`).
        grid = max(1, min(bucket(G_all), (budget - fixed) // max(per_point, 1)))
        cache = _cache_bytes(device, n_devices, memory_budget)
        if cache is not None and sz.carry:  # (a front that carries nothing between blocks: no such limit)
            fit = max(1, cache // (N * sz.carry))  # equal chunks share one compiled program
            if fit < grid:  # balanced chunks, at their bucket size: a grid of nearby size shares the program
                grid = min(grid, bucket(-(-G_all // -(-G_all // fit))))
    if not per_seed:  # the grid is split over the devices (a seed chunk splits its seeds)
        grid = -(-grid // n_devices) * n_devices
    blocks = _blocks_per_segment(sz, L, grid, seeds, per_seed, budget, segment_blocks, device)
    device_bytes = call_bytes(sz, grid, seeds, blocks, per_seed)  # all devices of the call together
    lazy = log_bytes(spec, sz) > LAZY_LOG_BYTES and out is not None
    host = per_seed_bytes(spec, sz) + (0 if lazy else log_bytes(spec, sz))
    if per_seed:
        host += grid * N * sz.carry + blocks * grid * N * sz.report_seed
    disk = disk_bytes(spec, sz, grid, lazy, seeds < N or blocks < L)
    host_budget = host_budget if host_budget is not None else int(host_available() * 0.8)
    if host > host_budget:
        logs = 0 if lazy else log_bytes(spec, sz)
        if logs > per_seed_bytes(spec, sz):
            where = ("write the run to a directory (--out) so the logs stream to disk, or "
                     if out is None else "")
            raise TooLarge(f"log_every: {L + 1} log points x {G_all} grid points need about {human(logs)} of "
                           f"host memory; about {human(host_budget)} is available; {where}log less often "
                           "(a larger log_every)")
        raise TooLarge(f"seeds: {N} seeds x {G_all} grid points need about {human(host)} of host memory for "
                       f"the per-seed results; about {human(host_budget)} is available; use fewer seeds or "
                       "grid points")
    mapped = log_bytes(spec, sz) + 8 * sz.log_points if lazy else 0  # the finished run maps its logs and steps
    _check_address_space(spec, sz, device, device_bytes, host, mapped)
    if out is not None:
        free = disk_free(out)
        if disk > free:
            raise TooLarge(f"log_every: the run's files need about {human(disk)} on disk ({logs_text(spec, sz)}); "
                           f"{human(free)} is free where {out!r} is; log less often (a larger log_every) or free "
                           "space")
    return Plan(grid, seeds, blocks, budget, device_bytes, host, disk, lazy, N, L)


def _check_address_space(spec, sz: Sizes, device, device_bytes: int, host: int, mapped: int) -> None:
    """`TooLarge` naming the field to change when the run would not fit under the
    address-space limit (`ulimit -v`): what this process has mapped now, plus
    the call's buffers (a CPU device's are the process's own), the host arrays,
    the log files the finished run maps and a margin, counted together."""
    limit = address_space_limit()
    if limit is None:
        return
    used = address_space_used()
    device_bytes = device_bytes if device.platform == "cpu" else 0
    need = device_bytes + host + mapped + ADDRESS_MARGIN
    if used + need <= limit:
        return
    G = spec.num_points
    logs = mapped + (host - per_seed_bytes(spec, sz) if not mapped else 0)
    parts = {"log_every": logs, "memory_budget": device_bytes, "seeds": per_seed_bytes(spec, sz)}
    field = max(parts, key=parts.get)
    what = {"log_every": f"for the logs of {logs_text(spec, sz)}",
            "memory_budget": "for one compiled call's buffers",
            "seeds": f"for the per-seed results of {spec.seeds} seeds x {G} grid points"}[field]
    todo = {"log_every": "log less often (a larger --log-every)",
            "memory_budget": "lower --memory-budget",
            "seeds": "use fewer seeds or grid points"}[field]
    raise TooLarge(f"{field}: the run needs about {human(need)} of address space ({human(parts[field])} of it "
                   f"{what}) on top of the {human(used)} this process has; {address_space_note()}; {todo} "
                   "or raise the limit (ulimit -v)")
