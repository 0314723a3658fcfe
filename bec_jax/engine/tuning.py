"""Tuning: how a program is built and compiled, never what it computes.

Every performance choice of a program is one value, a `KernelForm`, chosen by
one function, `choose_form`, from the platform, the work size and the user's
XLA options; it is part of the executable cache's key (`memo_key`). The
kernel reads its form (`kernel.make_kernel`), and the XLA options a program
compiles with are the form's (`KernelForm.compiler_options`). Also here: the
process's cache of compiled programs (`memo_get`, `memo_put`,
`clear_compiled`). Every choice here changes compile or run time only: results
are the same bit for bit under each form (tests/test_sweep.py). Measurements
behind the choices are in benchmarks/README.md.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import NamedTuple

import jax

from bec_jax.mdp import fingerprint

# Steps per iteration of the inner scan. Unrolling amortises the while loop's
# per-iteration copies of the carried state (it helps TD in isolation), but lets
# XLA fuse across steps and duplicate the TD error's computation into every
# consumer, which for CTDC grows exponentially with the unroll. On the standard
# workload 1 beats 2 (benchmarks/README.md).
UNROLL = 1

# LLVM's -O1 halves XLA's CPU compile time for these small scanned kernels with no
# measurable loss of run time (benchmarks/README.md).
_CPU_O1 = {"xla_backend_optimization_level": 1}
# The options of a CPU form with XLA:CPU's (MLIR) fusion emitters, XLA's default.
CPU_COMPILER_OPTIONS = {**_CPU_O1,
                        # Copy insertion with region analysis sees that the step's
                        # loop may update omega in place: without it XLA:CPU copied
                        # omega every step (the same bits, faster). The classic
                        # emitters' programs do not gain, so the light options
                        # leave it out (benchmarks/README.md).
                        "xla_cpu_copy_insertion_use_region_analysis": True}
# The options of a CPU form with XLA:CPU's classic loop emitters: compiles in
# under half the time, runs slower, bit for bit the same results
# (benchmarks/README.md). Below 10^9 updates the compile saved is worth about as
# much as the run time lost, or more.
CPU_LIGHT_OPTIONS = {**_CPU_O1, "xla_cpu_use_fusion_emitters": False}
LIGHT_COMPILE_UPDATES = 1_000_000_000
# XLA:CPU splits a fusion it judges costly into parallel tasks on its thread
# pool. In a program of many small dependent steps (a control step: gathers of
# a few weights per run) the handoff between threads costs more than the work:
# a front whose programs are such sets SERIAL_FUSIONS, and its CPU programs
# are compiled without the pass (benchmarks/README.md).
CPU_SERIAL_OPTIONS = {"xla_disable_hlo_passes": "cpu-parallel-task-assigner"}
_EMITTER_OPTIONS = {"fusion": CPU_COMPILER_OPTIONS, "loop": CPU_LIGHT_OPTIONS}
# Where pairing log blocks (`KernelForm.paired`) was measured to pay, by
# (platform, emitters): it works around a copy XLA:CPU's fusion emitters make
# of the state between blocks, and doubles the program. Elsewhere it was not
# measured to gain (the loop emitters: it compiles half as long again and
# runs no faster) or not measured at all, and the plain form is kept
# (benchmarks/README.md).
PAIRING_PAYS = frozenset({("cpu", "fusion")})
# Where a data-dependent conditional in a scanned body (the kernel's revert, a
# control step's resets and block's revert) was measured to cost less than a
# select that does the work every time: on XLA:CPU (2 cores, loaded) the
# selects took the standard workload from 151 to 84 M updates/s and control
# sweeps on tile-coded tasks up to 1.5-2.7 times as long (the same bits).
# Elsewhere the select: XLA:GPU reads a conditional's predicate back to the
# host each time round.
CONDITIONALS_PAY = frozenset({"cpu"})


class KernelForm(NamedTuple):
    """The form of a program: how it is built and compiled, never what it
    computes (the results are the same bit for bit under every form). Chosen
    by `choose_form`; part of the executable cache's key.

    Attributes:
      platform: the devices' platform ("cpu", "gpu", "tpu").
      emitters: XLA:CPU's emitters, "fusion" (its MLIR fusion emitters, XLA's
        default; also the value off the CPU, where there is no choice) or
        "loop" (the classic loop emitters: compile in under half the time,
        run slower).
      paired: log blocks two an iteration, each with its first step outside
        its loop of steps, so the state needs no copy between blocks, in a
        program about twice as long (`kernel._blocks`). Only where it was
        measured to pay (`PAIRING_PAYS`): XLA:CPU's fusion emitters. With the
        loop emitters the longer program compiles half as long again and runs
        no faster; off the CPU it was not measured, and a GPU need not make
        the copy it works around.
      share: the updates of the algorithms that declare
        `Algorithm.shares_scalars` are traced under `algorithms.sharing`, each
        TD error and dot product computed once a step into an array every
        consumer reads. Only on a CPU with the fusion emitters: it makes the
        loop emitters' loops slower, and elsewhere a conditional can cost a
        round trip to the host.
      unroll: steps per iteration of the inner scan (`UNROLL`).
      branches: "cond" (a per-block or per-step branch on the runs' data,
        the revert of diverged runs or a control step's resets, is a
        conditional that skips the work when no run needs it) or "select"
        (the work every time, kept where needed by a select: no predicate
        read back to the host). "cond" where it was measured to pay
        (`CONDITIONALS_PAY`); the same results either way.
      xla_options: the XLA options the program compiles with, as (name,
        value) pairs sorted by name: the user's where given, else the form's
        emitters' (`CPU_COMPILER_OPTIONS`, `CPU_LIGHT_OPTIONS`; none off the
        CPU). `compiler_options` gives them as `compile` takes them.

    Not part of the form, because they are not choices: the states' layout,
    seed-major (`engine.layout`: the kernel has that one), and the unrolled
    dot products of `algorithms.base` (`UNROLL_DOT_MAX`), whose order of
    additions is part of what an update computes.
    """

    platform: str
    emitters: str
    paired: bool
    share: bool
    unroll: int
    xla_options: tuple
    branches: str = "select"

    @property
    def compiler_options(self) -> dict | None:
        """The XLA options as `Lowered.compile` takes them (None: none)."""
        return dict(self.xla_options) or None


def choose_form(spec, devices=None, group=None, compiler_options: dict | None = None,
                updates: int | None = None, front=None) -> KernelForm:
    """The form of a group's program: the one place a program's performance
    choices are made.

    `devices` (None: JAX's default devices) give the platform. The user's
    `compiler_options`, where given, are compiled with as they are, and the
    form follows their emitters. Otherwise, on the CPU, the emitters follow
    the work: the loop emitters (the light compile, `CPU_LIGHT_OPTIONS`) for a
    prediction sweep of fewer than `LIGHT_COMPILE_UPDATES` updates in all and
    for every control sweep (their programs run as fast with them); the
    fusion emitters (`CPU_COMPILER_OPTIONS`) for larger sweeps and for a group
    of several models (an environment-parameter sweep): with the loop
    emitters its metrics can round differently in the last bit from a
    one-model run of the same point (tests/test_open_engine.py), while
    one-model programs give the same bits either way (tests/test_sweep.py).
    Off the CPU, no options. `updates`: the work the program runs; by default
    what the spec's `front` (an `engine.protocol.Engine`) says,
    `front.updates(spec)` (None there, or no front, takes the light compile);
    a program shared by several sweeps (`joint.run_many`) gives theirs
    together. A front with `SERIAL_FUSIONS` (`serial_fusions`) gets `CPU_SERIAL_OPTIONS` too. Then
    `share` follows from the emitters and the platform, and `paired` and
    `branches` from what was measured to pay (`PAIRING_PAYS`,
    `branches_for`; see `KernelForm`)."""
    platform = (list(devices) if devices is not None else jax.devices())[0].platform
    if compiler_options is not None:
        options = dict(compiler_options)
        emitters = "fusion" if options.get("xla_cpu_use_fusion_emitters", True) else "loop"
    elif platform != "cpu":
        options, emitters = {}, "fusion"
    else:
        if updates is None and front is not None:
            updates = front.updates(spec)
        emitters = _cpu_emitters(group, updates)
        options = _EMITTER_OPTIONS[emitters]
        if serial_fusions(front, spec):
            options = {**options, **CPU_SERIAL_OPTIONS}
    paired = (platform, emitters) in PAIRING_PAYS
    return KernelForm(platform=platform, emitters=emitters, paired=paired,
                      share=emitters == "fusion" and platform == "cpu", unroll=UNROLL,
                      xla_options=tuple(sorted(options.items(), key=lambda kv: kv[0])),
                      branches=branches_for(platform))


def branches_for(platform: str) -> str:
    """`KernelForm.branches` on `platform`: "cond" where conditionals were
    measured to pay (`CONDITIONALS_PAY`), else "select"."""
    return "cond" if platform in CONDITIONALS_PAY else "select"


def serial_fusions(front, spec) -> bool:
    """Whether `front`'s program of `spec` is many small dependent steps
    (`CPU_SERIAL_OPTIONS`): the front's `serial_fusions(spec)` where it has one
    (a front whose programs differ: continuing control's network learners are
    large products, its linear ones small steps), else its `SERIAL_FUSIONS`."""
    per_spec = getattr(front, "serial_fusions", None)
    return bool(per_spec(spec)) if callable(per_spec) else bool(getattr(front, "SERIAL_FUSIONS", False))


def _cpu_emitters(group, updates: int | None) -> str:
    """XLA:CPU's emitters for a program the user gave no options for (see `choose_form`)."""
    if group is not None and len(getattr(group, "models", ())) > 1:
        return "fusion"
    return "fusion" if updates is not None and updates >= LIGHT_COMPILE_UPDATES else "loop"


def on_cpu(devices) -> bool:
    """Whether a program for `devices` (None: JAX's default devices) runs on a CPU."""
    return (list(devices) if devices is not None else jax.devices())[0].platform == "cpu"


# Compiled programs kept in this process, so a sweep run again with another base
# seed (a confirmation on fresh seeds, say) or other step sizes, or a chunk shape
# seen before, skips compiling: the seed and the grid's values are arguments of
# the program, everything else that shapes it is in the key. The least recently
# used are dropped beyond MAX_EXECUTABLES.
MAX_EXECUTABLES = 32
_EXECUTABLES: OrderedDict = OrderedDict()
_EXECUTABLES_LOCK = threading.Lock()  # sweeps may run in threads (the reproductions do)


def clear_compiled() -> None:
    """Forgets the compiled programs kept in this process: the next sweep
    compiles afresh (benchmarks that time compiles call it)."""
    with _EXECUTABLES_LOCK:
        _EXECUTABLES.clear()


def memo_get(memo):
    """The compiled program kept under `memo` (None: nothing kept, or no key)."""
    if memo is None:
        return None
    with _EXECUTABLES_LOCK:
        hit = _EXECUTABLES.get(memo)
        if hit is not None:
            _EXECUTABLES.move_to_end(memo)
    return hit


def memo_put(memo, hit) -> None:
    """Keeps `hit` under `memo`, dropping the least recently used beyond MAX_EXECUTABLES."""
    if memo is None:
        return
    with _EXECUTABLES_LOCK:
        _EXECUTABLES[memo] = hit
        while len(_EXECUTABLES) > MAX_EXECUTABLES:
            _EXECUTABLES.popitem(last=False)


def spec_shape(spec) -> dict:
    """`spec.to_dict()` without what a program takes as input: the base seed and
    the grid's values (its columns' names stay). The spec's part of
    `memo_key` and of `engine.program_cache.file_key`. A spec with more of
    its dict taken as input has a `program_shape(d)` that drops it
    (a control spec's `program_shape`: traced task axes)."""
    d = spec.to_dict()
    d.pop("seed", None)
    for field in ("hyperparameters", "env_params"):  # values traced, or in the models and group.static
        if isinstance(d.get(field), dict):
            d[field] = sorted(d[field])
    if d.get("points") is not None:
        d["points"] = sorted({name for p in d["points"] for name in p})
    hook = getattr(spec, "program_shape", None)
    return hook(d) if hook is not None else d


def memo_key(spec, group, size: int, devices, form: KernelForm, front) -> tuple:
    """What a compiled chunk program depends on: the spec but its base seed and
    its grid's values (traced inputs; the names of its columns stay), the
    group's static hyperparameters and models (by content), the algorithm's
    functions (and whether it shares its scalars), the rest of the code the
    front bakes into the program (`front.program_sources(spec)`: a metric or
    a task registered again under its name bakes other constants in), the
    chunk size, the devices, the program's form (its compiler options
    included) and the front that made the program (`front.KIND`). So a sweep
    with other step sizes, or another grid size in the same bucket, reuses it."""
    d = spec_shape(spec)
    alg = spec.algorithm_def
    models = tuple(fingerprint(m) for m in group.models)
    builders = tuple(s if s is None or isinstance(s, str) else id(s) for s in front.program_sources(spec))
    return (json.dumps(d, sort_keys=True, default=str), models, id(alg.init), id(alg.update), builders,
            getattr(alg, "shares_scalars", False), group.static, len(group.models), size,
            tuple(dev.id for dev in devices), json.dumps(form._asdict(), default=str), front.KIND)


