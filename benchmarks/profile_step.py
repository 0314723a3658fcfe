"""What one step of the standard workload costs, and why.

Prints the optimised XLA loop body of the bare CTDC update (576 grid points x 50
seeds, the standard workload's shapes), as the update function alone and under
`algorithms.sharing` (as the sweep engine runs it on a CPU): every fusion, copy
and conditional in it is one pass over an array of every run. Then times both
bare update loops against the full sweep, so the share of sampling and logging is
visible: the full program's rate over the shared bare loop's (the same update),
against issue 15's target of at least 90%. Both are medians of
`--repeats` timed calls (after a warm-up) in the same process, taken in
alternating rounds, and the device they ran on is printed. The full program is
compiled as a long sweep's is (the fusion emitters, in its run-fast form:
`tuning.KernelForm`).

One device on one core: the process pins itself to one core before JAX starts
(`--no-pin` leaves it), so both rates are per core. Unpinned on a 2-core machine,
XLA:CPU runs a one-device program's independent kernels on two threads, and both
loops ran slower than on one core (standard workload 113-117 against 197-200 M
updates/s on an AVX-512 Xeon): the command line gives each core a device instead.

    python -m benchmarks.profile_step [--algorithm ctdc] [--steps 1000] [--repeats 5] [--no-pin]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import time

import jax
import jax.numpy as jnp

from bec_jax import algorithms
from bec_jax.engine import tuning
from bec_jax.engine.layout import state_axes
from bec_jax.prediction import sweep
from bec_jax.transition import Transition
from benchmarks import _common

G, N, K = 576, 50, 4


def _options() -> dict:
    """XLA:CPU's fusion emitters on a CPU (`tuning.CPU_COMPILER_OPTIONS`); nothing elsewhere."""
    return tuning.CPU_COMPILER_OPTIONS if jax.devices()[0].platform == "cpu" else {}


def bare_update_loop(name: str, steps: int, share: bool = False):
    """A jitted scan of `steps` vmapped updates on fixed random transitions; with
    `share`, under `algorithms.sharing` as the sweep engine runs them on a CPU."""
    alg = algorithms.get(name)
    keys = jax.random.split(jax.random.key(0), 3)
    phi = jax.random.uniform(keys[0], (steps, N, K))
    phi_next = jax.random.uniform(keys[1], (steps, N, K))
    reward = jax.random.uniform(keys[2], (steps, N))
    grid = {n: v for n, v in (("alpha", jnp.linspace(0.01, 0.1, G)), ("beta", jnp.full(G, 0.1)),
                               ("zeta", jnp.full(G, 0.05))) if n in alg.names}
    # As the engine does (`bec_jax.prediction.kernel`): every state leaf batched over (seeds,
    # grid), seed-major, but the update counter, which all runs share.
    axes = state_axes(alg.init(jnp.zeros(K)), alg.counter)
    update = jax.vmap(jax.vmap(alg.apply, in_axes=(axes, None, 0), out_axes=axes),
                      in_axes=(axes, 0, None), out_axes=axes)
    state = jax.tree_util.tree_map(lambda x, ax: x if ax is None else jnp.broadcast_to(x, (N, G) + x.shape),
                                   alg.init(jnp.zeros(K)), axes)

    def body(s, xs):
        p, pn, r = xs
        # A reward (here a uniform): a number XLA cannot fold.
        with algorithms.sharing(r[0]) if share else contextlib.nullcontext():
            return update(s, Transition(p, r, jnp.full_like(r, 0.9), pn, jnp.ones_like(r)), grid), None

    f = jax.jit(lambda s: jax.lax.scan(body, s, (phi, phi_next, reward))[0])
    return f.lower(state).compile(_options()), state


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="ctdc")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one core")
    args = ap.parse_args(argv)
    pinned = None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        pinned = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {pinned})
    jax.config.update("jax_num_cpu_devices", 1)  # a one-core profile: no sharding

    loops = {share: bare_update_loop(args.algorithm, args.steps, share) for share in (False, True)}
    for share, (compiled, _) in loops.items():
        text = compiled.as_text()
        body = text[text.index("%region_0"):]
        body = body[: body.index("\n}\n")]
        print(f"optimised loop body of one {args.algorithm} step, ({N}, {G}, {K}) state (seeds, grid, features), one device, "
              + ("under algorithms.sharing:" if share else "as the update function alone:"))
        passes = 0
        for line in body.splitlines():
            m = re.search(r"%(\S+) = (\S+) (fusion|copy|conditional)\(", line)
            if m and f"{N},{G}" in m.group(2):
                passes += 1
                print(f"  {m.group(3):11s} {m.group(2)[:40]:40s} {m.group(1)}")
        print(f"{passes} passes over (N, G, ...) arrays per step")

    dev = jax.devices()[0]
    print(f"device: {dev.platform} {dev.device_kind} ({_common.machine_info()['cpu_model']}), "
          + (f"pinned to core {pinned}" if pinned is not None else "not pinned"))
    for compiled, state in loops.values():
        jax.block_until_ready(compiled(state))
    spec = _common.standard_spec(steps=args.steps) if args.algorithm == "ctdc" else None
    opts = _options()  # the full program compiled as the bare loop is
    if spec is not None:
        sweep.run(spec, progress=False, compiler_options=opts)
    # Rounds alternate between the loops, so all see the same machine.
    times, full = {False: [], True: []}, []
    for _ in range(args.repeats):
        for share, (compiled, state) in loops.items():
            t = time.perf_counter()
            jax.block_until_ready(compiled(state))
            times[share].append(time.perf_counter() - t)
        if spec is not None:
            full.append(sweep.run(spec, progress=False, compiler_options=opts).meta["updates_per_s"])
    rate = {share: G * N * args.steps / statistics.median(t) for share, t in times.items()}
    for share, r in rate.items():
        print(f"bare update loop{' under algorithms.sharing' if share else ''}, one device: "
              f"{r / 1e6:.0f} M updates/s (median of {args.repeats}, {args.steps} steps)")
    if spec is not None:  # the standard workload, on the same one device
        full = statistics.median(full)
        ratio = full / rate[True]
        print(f"full sweep (sampling + logging every 10 steps; its updates under sharing, as with the fusion emitters on a CPU), "
              f"one device: {full / 1e6:.0f} M updates/s (median of {args.repeats})")
        print(f"  = {ratio:.0%} of the bare loop under sharing (target >= 90%: {'met' if ratio >= 0.9 else 'NOT MET'}), "
              f"{full / rate[False]:.0%} of the bare loop of the update function alone")


if __name__ == "__main__":
    main()
