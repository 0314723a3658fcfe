"""How much of a control program's work goes to runs that have already
finished, and what compacting the live runs could save at best.

    python -m benchmarks.control_waste results/control [--group 32] [--smoke]

The argument is the output of `bec-jax reproduce --paper control` (its
`sweeps/<task>-<algorithm>/`, the grids' results; the fresh-seed confirmations
and the shift controls are left out). A control program runs each member (one
algorithm's grid points x seeds, one batch) block after block until its last
run has logged its episodes or spent its step budget; a member whose runs have
all finished skips its blocks. A run that finished early steps on with its
member. From the steps each run logged, per task:

  useful      the steps the runs needed: the sum over runs;
  member      the run-steps computed with member-level skipping (what the
              program does): each member's runs x its longest run;
  per point   the same with each grid point's seeds a group of their own,
              skipped on its own;
  compacted   the live runs sorted to the front and stepped in groups of
              `--group` runs: each group costs its size x its longest run.
              The best compaction can do, before its costs.

The table gives useful / computed for each. Block granularity is left out (a
block is 100 to 1000 steps of runs of 10^4 to 10^6). The other side of the
trade is the cost of a smaller batch: a control step is 30-50 dispatched
operations whatever the batch (`benchmarks.control_roofline --runs 8`).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks import _common


def computed(members: list[np.ndarray], mode: str, group: int = 32) -> int:
    """Run-steps computed for members given as (points, seeds) arrays of the
    steps each run needed, under `mode` ("member", "point" or "compacted",
    see the module docstring)."""
    total = 0
    for steps in members:
        steps = np.asarray(steps, np.int64)
        if mode == "member":
            total += steps.size * int(steps.max())
        elif mode == "point":
            total += int((steps.shape[1] * steps.max(axis=1)).sum())
        elif mode == "compacted":
            flat = np.sort(steps.reshape(-1))[::-1]
            total += sum(len(flat[i:i + group]) * int(flat[i]) for i in range(0, len(flat), group))
        else:
            raise ValueError(f"mode: member, point or compacted, got {mode!r}")
    return total


def load(path: str) -> dict[str, list[np.ndarray]]:
    """{task: [(points, seeds) steps per run, one array per algorithm]} from a
    control reproduction's grids."""
    from bec_jax.control.results import ControlResult
    base = os.path.join(path, "sweeps")
    if not os.path.isdir(base):
        raise SystemExit(f"{path}: no sweeps/ (give the output of bec-jax reproduce --paper control)")
    out: dict[str, list[np.ndarray]] = {}
    for name in sorted(os.listdir(base)):
        if name.endswith(("-confirm", "-shift")):
            continue
        r = ControlResult.load(os.path.join(base, name))
        out.setdefault(name.split("-")[0], []).append(r.lengths.sum(axis=-1))
    return out


# --smoke: two tasks of hand-made run lengths (no reproduction needed).
SMOKE = {"a": [np.array([[10, 20], [100, 90]]), np.array([[5, 5, 5]])], "b": [np.array([[7, 8]])]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", help="the output directory of bec-jax reproduce --paper control")
    ap.add_argument("--group", type=int, default=32, help="runs a group of the compacted batch")
    ap.add_argument("--smoke", action="store_true", help="hand-made run lengths: checks the script works")
    ap.add_argument("--out-dir", default=_common.RESULTS_DIR)
    a = ap.parse_args(argv)
    if a.path is None and not a.smoke:
        ap.error("path: the output directory of bec-jax reproduce --paper control (or --smoke)")
    by_task = SMOKE if a.smoke else load(a.path)
    rows, lines = [], ["| task | runs | members | useful run-steps | member (today) | per point | "
                       f"compacted, groups of {a.group} |", "|---|---|---|---|---|---|---|"]
    for task, members in by_task.items():
        useful = sum(int(m.sum()) for m in members)
        frac = {mode: useful / computed(members, mode, a.group) for mode in ("member", "point", "compacted")}
        rows.append({"task": task, "runs": int(sum(m.size for m in members)), "members": len(members),
                     "useful_run_steps": useful, **{f"useful_fraction_{k}": v for k, v in frac.items()}})
        lines.append(f"| {task} | {rows[-1]['runs']} | {len(members)} | {useful / 1e6:.1f} M "
                     f"| {frac['member']:.2f} | {frac['point']:.2f} | {frac['compacted']:.2f} |")
    print("\n".join(lines))
    _common.write_json(_common.result_path(a.out_dir, "control_waste", a.smoke),
                       {"machine": _common.machine_info(), "group": a.group, "rows": rows})


if __name__ == "__main__":
    main()
