"""The joint runner: several sweeps of one front in one compiled program.

Sweeps that share everything but their algorithm and its hyperparameters (the
algorithms of one task, say), each run in one call, can share one program: a
compile is most of the cost of a small sweep. `shared_programs` packs them
(the front's `joint_key` says which may share, its `fits_together` how many
fit one call), `run_many` runs each pack by one program (`run_joint`) and every
other sweep by the front's `run`. The steps are the same for every front; what
differs is the front's (`engine.protocol.Engine`, "joint runs"): its
chunks, grid inputs, program, how the outputs split into members and each
member's meta.
"""
from __future__ import annotations

import hashlib
import time

import jax
import numpy as np

from bec_jax.engine import execute, program_cache, tuning
from bec_jax.engine.protocol import check_dtype
from bec_jax.engine.waits import await_result


def packs(specs: list, front, devices) -> tuple[list[list[int]], dict]:
    """(packs, infos): `specs`' indices in the programs `run_many` gives them, in
    order of their first sweep (a sweep joins the open pack of its key while
    the pack fits one call), and what `front.joint_key` said of each sweep that
    can share (its memory plan, say)."""
    out: list[list[int]] = []
    open_pack: dict = {}  # key -> the pack its next sweep may join
    infos: dict = {}
    for i, spec in enumerate(specs):
        found = front.joint_key(spec, devices)
        if found is None:
            out.append([i])
            continue
        key, infos[i] = found
        pack = open_pack.get(key)
        if pack is None or not front.fits_together([specs[j] for j in pack] + [spec], devices):
            pack = open_pack[key] = []
            out.append(pack)
        pack.append(i)
    return out, infos


def shared_programs(specs: list, front, devices=None) -> list[list[int]]:
    """How `run_many` runs `specs`: lists of their indices, one per compiled
    program (a list of one: that sweep runs alone, by `front.run`)."""
    devices = list(devices) if devices is not None else jax.devices()
    return packs(specs, front, devices)[0]


def run_many(specs: list, front, *, devices=None, compiler_options: dict | None = None,
             progress: bool | None = False) -> list:
    """Runs every sweep of `specs` (all of `front`'s kind); returns their results
    in order, each what `front.run(spec)` returns: the packs of
    `shared_programs` by one program each (`run_joint`), the rest by
    `front.run`."""
    devices = list(devices) if devices is not None else jax.devices()
    out: list = [None] * len(specs)
    found, infos = packs(specs, front, devices)
    for pack in found:
        if len(pack) == 1:
            out[pack[0]] = front.run(specs[pack[0]], devices=devices, compiler_options=compiler_options,
                                     progress=progress)
        else:
            for i, r in zip(pack, run_joint([specs[i] for i in pack], front, [infos[i] for i in pack], devices,
                                            compiler_options, progress)):
                out[i] = r
    return out


def run_joint(specs: list, front, infos: list, devices, compiler_options: dict | None = None,
              progress: bool | None = False) -> list:
    """Sweeps that `shared_programs` packed (with what `front.joint_key` said of
    each), run by one program: compiled once (or taken from the process's
    cache, `tuning.memo_get`, or from disk, `program_cache`), called once
    (`progress`: a line that ticks while it runs), its outputs split into the
    members' results. The
    compile and run times go to the first member's meta; every member's meta
    names the program's sweeps (`shared_program`) and its place among them
    (`shared_program_index`)."""
    for spec in specs:
        check_dtype(spec)
    n_dev = len(devices)
    groups, chunks = front.joint_chunks(specs, infos, devices)
    sizes = [len(c.indices) for c in chunks]
    updates = sum(front.updates(s) for s in specs)
    form = tuning.choose_form(specs[0], devices, groups[0], compiler_options, updates=updates, front=front)
    t = time.perf_counter()
    memo = tuple(tuning.memo_key(s, g, n, devices, form, front) for s, g, n in zip(specs, groups, sizes)) + ("joint",)
    grids = tuple(front.joint_grid(s, g, c, n_dev) for s, g, c in zip(specs, groups, chunks))
    def inputs(placed):  # (seed, one grid chunk per sweep), placed as the program wants them
        return (execute.place(np.uint32(specs[0].seed), placed[0]),
                tuple({k: execute.place(v, placed[1]) for k, v in g.items()} for g in grids))

    hit, made = tuning.memo_get(memo), 0
    if hit is None:
        program = front.joint_program(specs, groups, sizes, devices, form)
        placed = execute.placements(program.mesh, devices[0])
        key = joint_file_key(specs, groups, sizes, devices, form, front)
        hit, made = (program_cache.compile_or_load(key, devices, program.fn, inputs(placed), form.compiler_options),
                     placed), 1
        tuning.memo_put(memo, hit)
    args = inputs(hit[1])
    compile_time = time.perf_counter() - t if made else 0.0
    t = time.perf_counter()
    line = execute.CallLine(1) if execute.watched(progress) else None
    if line is not None:
        line.start(0)
    out = execute.fetch(await_result(execute.call(hit[0], *args), 0, line))
    if line is not None and line.last:
        execute.end_line()
    run_time = time.perf_counter() - t
    names, results = [s.algorithm for s in specs], []
    for m, (spec, info, group, chunk, part) in enumerate(zip(specs, infos, groups, chunks,
                                                             front.split_joint(out, sizes, n_dev))):
        first = m == 0
        ran = execute.ChunkRun({0: {k: np.asarray(v)[: chunk.n] for k, v in part.items()}},
                               compile_time if first else 0.0, run_time if first else 0.0, made if first else 0,
                               chunk.n if first else 0)
        meta, more = front.joint_meta(specs, m, group, chunk, ran, info, devices, form, run_time)
        meta = {**meta, "shared_program": names, "shared_program_index": m, **more}
        results.append(front.assemble(spec, [group], [chunk], ran.results, meta))
    return results


def joint_file_key(specs: list, groups: list, sizes: list, devices, form, front) -> str | None:
    """The program cache's key of a joint program (`program_cache.file_key`):
    its members' keys in their order, or None where any member's program may
    not be kept."""
    keys = [program_cache.file_key(s, g, n, devices, form, front, extra=("joint",))
            for s, g, n in zip(specs, groups, sizes)]
    if any(k is None for k in keys):
        return None
    return hashlib.sha256(("joint|" + "|".join(keys)).encode()).hexdigest()
