"""One benchmark configuration in a fresh process (internal; run by the scripts).

    python -m benchmarks._worker '{"spec": {...}, "repeats": 3, "cpu_devices": 2,
                                   "cache_dir": null, "label": "..."}'
    python -m benchmarks._worker - < config.json       # the same, from stdin

Sets the JAX device count and the persistent-cache policy before JAX starts, runs
`bec_jax.prediction.sweep.run(spec)` `repeats` times and prints one JSON line: the compile and
run times of each repeat (each `sweep.run` compiles afresh; with a cache dir the
compile may be a cache hit), the resident memory before the first sweep, and the
process's peak resident memory (VmHWM) at the end. A fresh process per
configuration keeps the peaks of different configurations apart.
"""
from __future__ import annotations

import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(sys.stdin.read() if not argv or argv[0] == "-" else argv[0])
    n = _common.use_all_cpu_cores(cfg.get("cpu_devices"))
    _common.configure_cache(cfg.get("cache_dir"))

    import jax
    import jax.numpy as jnp

    from bec_jax.engine import tuning
    from bec_jax.prediction import sweep
    from bec_jax.prediction.spec import SweepSpec

    spec = SweepSpec.from_dict(cfg["spec"])
    jnp.zeros(()).block_until_ready()  # initialise the backend: the memory floor
    rss_before = _common.current_rss_bytes()
    hwm_before = _common.peak_rss_bytes()
    compile_s, run_s, ups = [], [], []
    meta = {}
    kwargs = {"chunk_size": cfg["chunk_size"]} if cfg.get("chunk_size") else {}
    kwargs["progress"] = False  # no progress callback compiled in, terminal or not
    for _ in range(int(cfg.get("repeats", 1))):
        tuning.clear_compiled()  # each repeat compiles afresh
        r = sweep.run(spec, **kwargs)
        meta = r.meta
        compile_s.append(meta["compile_time_s"])
        run_s.append(meta["run_time_s"])
        ups.append(meta["updates_per_s"])
        del r
    out = {
        "label": cfg.get("label"),
        "points": spec.num_points, "seeds": spec.seeds, "steps": spec.steps,
        "batch": spec.num_points * spec.seeds, "updates": meta.get("updates"),
        "cpu_devices_requested": n, "num_devices": len(jax.devices()),
        "chunk_size": meta.get("chunk_size"), "num_chunks": meta.get("num_chunks"),
        "cache_dir": cfg.get("cache_dir"),
        "compile_time_s": compile_s, "run_time_s": run_s, "updates_per_s": ups,
        "rss_before_sweep_bytes": rss_before, "peak_rss_before_sweep_bytes": hwm_before,
        "peak_rss_bytes": _common.peak_rss_bytes(),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
