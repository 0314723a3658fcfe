"""Where the bare CTDC update loop stands against this machine's ceilings (one core).

    python -m benchmarks.roofline [--smoke]

Three numbers, each measured here with XLA on one CPU device:
  1. the update's cost: flops and bytes per update, from XLA's own cost analysis
     of one step of the bare loop of `benchmarks.profile_step` (576 x 50 CTDC
     runs, 4 features): every fusion's and copy's operands and results counted;
  2. the compute ceiling: 8 independent chains of 32 multiply-adds per element,
     fused, on an L1-sized array (16 KiB), looped, so the loads and stores are
     negligible and the core can overlap the chains;
  3. the bandwidth ceiling for a state of the standard workload's size (1 MiB, in
     L2): one multiply-add per element, read and written once per pass.
Then the bare loop's rate gives its flop rate and byte rate as fractions of the
two ceilings. Output: a table and benchmarks/results/roofline.json.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import _common


def _timed(fn, x, repeats: int) -> float:
    jax.block_until_ready(fn(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compute_ceiling(iters: int, repeats: int, n: int = 4096, chain: int = 32, ways: int = 8) -> float:
    """flop/s of `ways` independent chains of `chain` multiply-adds per element
    (independent, so the core can overlap them), `n` float32 elements (L1)."""
    a, b = jnp.float32(0.999), jnp.float32(1e-3)

    def body(_, x):
        xs = [x + jnp.float32(i * 1e-3) for i in range(ways)]
        for _ in range(chain):
            xs = [v * a + b for v in xs]
        return sum(xs[1:], xs[0]) * jnp.float32(1 / ways)

    fn = jax.jit(lambda x: jax.lax.fori_loop(0, iters, body, x))
    t = _timed(fn, jnp.ones(n, jnp.float32), repeats)
    return (2 * chain + 2) * ways * n * iters / t


def bandwidth_ceiling(iters: int, repeats: int, nbytes: int = 1 << 20) -> float:
    """bytes/s of one read and one write per element per pass over `nbytes`."""
    n = nbytes // 4
    a, b = jnp.float32(0.999), jnp.float32(1e-3)
    fn = jax.jit(lambda x: jax.lax.fori_loop(0, iters, lambda _, y: y * a + b, x))
    t = _timed(fn, jnp.ones(n, jnp.float32), repeats)
    return 2 * 4 * n * iters / t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); checks the script works")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    args = ap.parse_args(argv)
    jax.config.update("jax_num_cpu_devices", 1)
    from benchmarks.profile_step import G, N, bare_update_loop

    steps = 20 if args.smoke else 1000
    compiled, state = bare_update_loop("ctdc", steps)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    # The cost analysis counts the loop body once: one step of G x N updates.
    flops_per_update = cost["flops"] / (G * N)
    bytes_per_update = cost["bytes accessed"] / (G * N)
    t = _timed(compiled, state, args.repeats)
    rate = G * N * steps / t

    peak_flops = compute_ceiling(50 if args.smoke else 20_000, args.repeats)
    peak_bw = bandwidth_ceiling(50 if args.smoke else 5_000, args.repeats)
    ridge = peak_flops / peak_bw
    intensity = flops_per_update / bytes_per_update
    bound = min(peak_flops / flops_per_update, peak_bw / bytes_per_update)
    rows = [
        ("flops per update (XLA cost analysis)", f"{flops_per_update:.0f}"),
        ("bytes per update (XLA cost analysis)", f"{bytes_per_update:.0f}"),
        ("arithmetic intensity", f"{intensity:.2f} flop/B (ridge point {ridge:.2f} flop/B)"),
        ("compute ceiling, one core", f"{peak_flops / 1e9:.1f} GFLOP/s (8 independent chains of 32 multiply-adds/element, L1)"),
        ("bandwidth ceiling, one core", f"{peak_bw / 1e9:.1f} GB/s (1 MiB array, in L2)"),
        ("bare loop, one core", f"{rate / 1e6:.0f} M updates/s = {rate * flops_per_update / 1e9:.1f} GFLOP/s "
                                f"({rate * flops_per_update / peak_flops:.0%} of compute), "
                                f"{rate * bytes_per_update / 1e9:.1f} GB/s ({rate * bytes_per_update / peak_bw:.0%} "
                                f"of bandwidth)"),
        ("roofline bound, one core", f"{bound / 1e6:.0f} M updates/s "
                                     f"({'bandwidth' if intensity < ridge else 'compute'}-bound at this intensity)"),
    ]
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:{width}s}  {v}")
    info, jinfo = _common.machine_info(), _common.jax_info()
    print(_common.describe_machine(info, jinfo))
    path = _common.result_path(args.out_dir, "roofline", args.smoke)
    _common.write_json(path, {
        "machine": info, "jax": jinfo, "smoke": args.smoke, "steps": steps, "flops_per_update": flops_per_update,
        "bytes_per_update": bytes_per_update, "bare_updates_per_s": rate, "peak_flops": peak_flops,
        "peak_bytes_per_s": peak_bw, "roofline_updates_per_s": bound})


if __name__ == "__main__":
    main()
