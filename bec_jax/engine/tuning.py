"""Tuning: how a program is compiled and kept, never what it computes.

The XLA options a program compiles with (`default_compiler_options`), the form
the kernel takes for them (`fast_program`, `UNROLL`), and the process's cache of
compiled programs (`memo_key`, `memo_get`, `memo_put`, `clear_compiled`). Every
choice here changes compile or run time only: results are the same bit for bit
under each (tests/test_sweep.py). Measurements behind the choices are in
benchmarks/README.md.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

import jax
import numpy as np

from bec_jax.mdp import fingerprint
from bec_jax.spec import SweepSpec

# Steps per iteration of the inner scan. Unrolling amortises the while loop's
# per-iteration copies of the carried state (it helps TD in isolation), but lets
# XLA fuse across steps and duplicate the TD error's computation into every
# consumer, which for CTDC grows exponentially with the unroll. On the standard
# workload 1 beats 2 (benchmarks/README.md).
UNROLL = 1

# LLVM's -O1 halves XLA's CPU compile time for these small scanned kernels with no
# measurable loss of run time (measured on the paper's sweeps); see README.
_CPU_O1 = {"xla_backend_optimization_level": 1}
CPU_COMPILER_OPTIONS = {**_CPU_O1,
                        # Copy insertion with region analysis sees that the step's
                        # loop may update omega in place: without it XLA:CPU copied
                        # omega every step (the same bits, faster). The classic
                        # emitters' programs do not gain, so the light options
                        # leave it out (benchmarks/README.md).
                        "xla_cpu_copy_insertion_use_region_analysis": True}
# XLA:CPU's classic loop emitters instead of its MLIR fusion emitters: compiles in
# under half the time, runs slower (the fusion emitters' programs take the
# run-fast form, `fast_program`), bit for bit the same results (benchmarks/README.md).
# Below 10^9 updates the compile saved is worth about as much as the run time
# lost, or more.
CPU_LIGHT_OPTIONS = {**_CPU_O1, "xla_cpu_use_fusion_emitters": False}
LIGHT_COMPILE_UPDATES = 1_000_000_000


def default_compiler_options(spec, platform: str, group=None, updates: int | None = None) -> dict:
    """The XLA options a group's program compiles with when the caller gives none.

    None off the CPU. On the CPU, `CPU_LIGHT_OPTIONS` for a prediction sweep of
    fewer than `LIGHT_COMPILE_UPDATES` updates in all and for every control sweep
    (their programs run as fast with them); else `CPU_COMPILER_OPTIONS`. A group of
    several models (an environment-parameter sweep) always gets the fusion
    emitters: with the loop emitters its metrics can round differently in the last
    bit from a one-model run of the same point (tests/test_open_engine.py), while
    one-model programs give the same bits either way (tests/test_sweep.py).
    `updates`: the program's updates when it runs more than `spec` (a program
    shared by several sweeps, `run_many`)."""
    if platform != "cpu":
        return {}
    if group is not None and len(getattr(group, "models", ())) > 1:
        return CPU_COMPILER_OPTIONS
    if updates is None and isinstance(spec, SweepSpec):
        updates = spec.num_points * spec.seeds * spec.steps
    if updates is not None and updates >= LIGHT_COMPILE_UPDATES:
        return CPU_COMPILER_OPTIONS
    return CPU_LIGHT_OPTIONS


def on_cpu(devices) -> bool:
    """Whether a program for `devices` (None: JAX's default devices) runs on a CPU."""
    return (list(devices) if devices is not None else jax.devices())[0].platform == "cpu"


def fast_program(compiler_options: dict | None) -> bool:
    """Whether a program compiled with `compiler_options` takes its run-fast form
    (`make_program`'s `fast`, see `kernel.make_kernel`): everywhere but with
    XLA:CPU's classic emitters (`CPU_LIGHT_OPTIONS`, the compile-light choice).
    With them the longer program of paired log blocks compiles half as long
    again, where the fusion emitters' compile barely moves, and
    `algorithms.sharing` makes their loops slower, not faster
    (benchmarks/README.md)."""
    return bool((compiler_options or {}).get("xla_cpu_use_fusion_emitters", True))


# Compiled programs kept in this process, so a sweep run again with another base
# seed (a confirmation on fresh seeds, say), or a chunk shape seen before, skips
# compiling: the seed is an argument of the program, everything else that shapes
# it is in the key. The least recently used are dropped beyond MAX_EXECUTABLES.
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


def memo_key(spec, group, size: int, devices, compiler_options, kind: str) -> tuple:
    """What a compiled chunk program depends on: the spec but its base seed, the
    group's models (by content), the algorithm's functions, the chunk size, the
    devices, the compiler options and `kind`, the front that made the program."""
    d = spec.to_dict()
    d.pop("seed", None)
    alg = spec.algorithm_def
    models = tuple(fingerprint(m) for m in group.models)
    return (json.dumps(d, sort_keys=True, default=str), models, id(alg.init), id(alg.update), group.static,
            tuple(np.asarray(group.indices).tolist()), size, tuple(dev.id for dev in devices),
            json.dumps(compiler_options, sort_keys=True, default=str), kind)


