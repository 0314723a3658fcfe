"""Long and large runs (issue 16): the memory plan against measured peak memory,
a 10^6-seed sweep within a budget, and the two commands that used to fail.

    python -m benchmarks.memory            # about 6 minutes on a 2-core CPU
    python -m benchmarks.memory --smoke    # tiny sizes: checks the script works

Every case runs `bec-jax run` in a fresh process (the command line exactly, one
JAX CPU device per core), which reports its peak resident memory (VmHWM) when it
ends. The plan's estimate (device bytes per call + host bytes, from `meta.json`)
is printed next to the measured peak less the peak of a tiny run (the process's
fixed cost: Python, JAX, XLA, the compiler).

  * `million`: Baird TD, 10^6 seeds x 1000 steps, log every 10, under
    `--memory-budget 256MB`: seed chunks, combined exactly.
  * `issue_seeds`: the issue's `--seeds 30000000` (7.8 GB in one call): runs in
    seed chunks within the default budget.
  * `issue_log_every`: the issue's `--steps 1000000000 --log-every 1`: planned as
    segments streaming to disk; stopped with SIGTERM after `--long-s` seconds
    (exit 143 at a segment boundary), the time to stop measured.

Writes benchmarks/results/memory.json with the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402

CHILD = r"""
import sys
from bec_jax.cli import commands as cli
code = cli.main(sys.argv[1:])
with open("/proc/self/status") as f:
    hwm = [l for l in f if l.startswith("VmHWM:")]
print("PEAK_RSS_KIB", hwm[0].split()[1] if hwm else -1, file=sys.stderr)
sys.exit(code)
"""


def run_cli(args: list[str], timeout: float = 1200.0, stop_after: float | None = None) -> dict:
    """`bec-jax` with `args` in a fresh process: exit code, wall time, peak RSS,
    the last stderr line; with `stop_after`, SIGTERM after that many seconds and
    the time it took to stop."""
    env = dict(os.environ, BEC_JAX_NO_CACHE="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stop_s = None
    if stop_after is not None:
        try:
            proc.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            t_sig = time.perf_counter()
            proc.wait(timeout=120)
            stop_s = time.perf_counter() - t_sig
    out, err = proc.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    peak = None
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("PEAK_RSS_KIB"):
            peak = int(ln.split()[1]) * 1024
    msgs = [ln for ln in lines if not ln.startswith("PEAK_RSS_KIB")]
    return {"args": args, "exit": proc.returncode, "wall_s": wall, "peak_rss": peak, "stop_s": stop_s,
            "stdout": out.strip().splitlines()[:2], "last_stderr": msgs[-2:] if msgs else []}


def meta_of(out: str) -> dict | None:
    path = os.path.join(out, "meta.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        m = json.load(f)
    return {k: m.get(k) for k in ("chunk_size", "seeds_per_call", "blocks_per_segment", "memory_estimate",
                                  "run_time_s", "compile_time_s", "updates_per_s")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--long-s", type=float, default=60.0, help="seconds before the SIGTERM of issue_log_every")
    ap.add_argument("--out", default=os.path.join(C.RESULTS_DIR, "memory.json"))
    a = ap.parse_args(argv)
    base = ["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.1"]
    cases = {
        "tiny": base + ["--steps", "10", "--seeds", "2", "--log-every", "10"],
        "million": base + ["--steps", "1000", "--seeds", "1000000", "--log-every", "10", "--memory-budget", "256MB"],
        "issue_seeds": base + ["--steps", "100", "--seeds", "30000000", "--log-every", "10"],
        "issue_log_every": base + ["--steps", "1000000000", "--seeds", "2", "--log-every", "1"],
    }
    if a.smoke:
        cases["million"] = base + ["--steps", "100", "--seeds", "20000", "--log-every", "10", "--memory-budget", "1MB"]
        cases["issue_seeds"] = base + ["--steps", "20", "--seeds", "100000", "--log-every", "10"]
        cases["issue_log_every"] = base + ["--steps", "100000000", "--seeds", "2", "--log-every", "1"]
        a.long_s = min(a.long_s, 8.0)
    tmp = tempfile.mkdtemp(prefix="bec-jax-memory-")
    report = {"machine": C.machine_info(), "smoke": a.smoke, "timestamp": C.timestamp(), "cases": {}}
    try:
        for name, args in cases.items():
            out = os.path.join(tmp, name)
            stop = a.long_s if name == "issue_log_every" else None
            r = run_cli(args + ["--out", out], stop_after=stop)
            r["meta"] = meta_of(out)
            if name == "issue_log_every":
                ck = os.path.join(out, "chunks", "chunk_00000", "checkpoint.npz")
                r["checkpoint_saved"] = os.path.isfile(ck)
                if r["checkpoint_saved"]:
                    import numpy as np
                    with np.load(ck) as z:
                        r["blocks_done"] = int(z["next_block"])
            report["cases"][name] = r
            print(f"{name:16s} exit {r['exit']:3d}  {r['wall_s']:7.1f} s  peak RSS {C.fmt_bytes(r['peak_rss'])}"
                  + (f"  stopped {r['stop_s']:.2f} s after SIGTERM" if r.get("stop_s") is not None else ""))
            if r["meta"]:
                est = r["meta"]["memory_estimate"]
                print(f"{'':16s} plan: {r['meta']['seeds_per_call']} seeds x {r['meta']['blocks_per_segment']} "
                      f"blocks per call; estimate {C.fmt_bytes(est['device_bytes_per_call'])} device + "
                      f"{C.fmt_bytes(est['host_bytes'])} host; {C.fmt_rate(r['meta']['updates_per_s'])} updates/s")
            for ln in r["last_stderr"]:
                print(f"{'':16s} {ln[:160]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fixed = report["cases"]["tiny"]["peak_rss"] or 0
    for name, r in report["cases"].items():
        if r.get("meta") and r["peak_rss"]:
            est = r["meta"]["memory_estimate"]
            r["estimate_bytes"] = est["device_bytes_per_call"] + est["host_bytes"]
            r["measured_above_fixed_bytes"] = r["peak_rss"] - fixed
            r["estimate_over_measured"] = r["estimate_bytes"] / max(1, r["measured_above_fixed_bytes"])
    print(C.describe_machine(report["machine"], C.jax_info()))
    print(f"wrote {C.write_json(a.out if not a.smoke else a.out.replace('.json', '_smoke.json'), report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
