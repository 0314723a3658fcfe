"""Confirmation on fresh seeds, for every kind of sweep: the chosen setting of
a finished sweep (prediction, episodic control, continuing control, or a
search of any of them) runs again on N seeds disjoint from the ones that chose
it, and its numbers are the result.

    check(spec, 5)                          # before any work: ValueError naming confirm_seeds
    report = confirm(result, "runs/x", 5)   # runs/x/confirm/ and runs/x/confirm.json
    print(confirm_line(report, "runs/x"))

Choosing the best of many settings on the same seeds that report it flatters
it: the best of G noisy estimates is biased toward luck (Patterson et al.
2024, "Empirical design in reinforcement learning"). The selection runs decide
*which* setting; the confirmation runs say *how good* it is.

Fresh seeds: a sweep's seed i is stream fold_in(key(seed), seed_offset + i)
(`engine.streams.per_seed_keys`), so the confirmation takes streams
seed_offset + seeds .. seed_offset + seeds + N - 1, the ones after the
selection's, with everything else of the spec unchanged: it equals, bit for
bit on the same machine, a direct run of that one point with that
`seed_offset`.

What is chosen, per kind (`run.kinds`: each kind's `Figures.check_metric` and
`Scores.chosen`, which every figure and table chooses by too): a prediction
sweep's lowest area under its error curve; a control sweep's best return per
episode (or steps per episode, `metric="length"`), at each value of its task
axes (a task axis is not a setting: `ControlResult.by_task_value`); a
continuing sweep's highest reward rate over the whole run (or a window).
Points whose score is NaN (a search's points stopped early hold NaN after
their last rung) are never chosen: every kind's `best_index` is NaN-aware.

confirm.json holds, for the chosen point, the selection runs' and the
confirmation runs' numbers: `seeds`, `seed_streams` [first, last], `score`
(the kind's per-seed selection score, `Scores.seed_scores`, its mean over
the seeds where it is finite) with `score_ci95`, and the kind's own summary:
a prediction sweep's final error and area (`final`, `auc`, with `_ci95`), a
control sweep's return and steps per episode over all episodes and the last
10% (`auc_return`, `final_return`, `auc_length`, `final_length`, ...), a
continuing sweep's reward rate over the whole run, its last 50% and last 10%
(`reward_rate_all`, ...); each interval is the 95% Student-t interval over
seeds. A control sweep with task axes confirms the best at each value of them:
then confirm.json lists them under `choices` and their runs are confirm/0/,
confirm/1/, ...
"""
from __future__ import annotations

import math
import os

import numpy as np

from bec_jax.files import write_json
from bec_jax.prediction.fields import MAX_INT32
from bec_jax.prediction.results import SweepResult
from bec_jax.run import kinds
from bec_jax.stats import t_interval

CONFIRM_DIR = "confirm"
CONFIRM_FILE = "confirm.json"
NOTE = ("the confirmation runs' numbers are the result; the selection runs chose the point and report it with "
        "their luck (selection only)")
# What a kind's line quotes of its summary besides the score: (label, key) of
# confirm.json's numbers, for a metric (prediction keeps its line of 0.3).
QUOTED = {
    "control": lambda m: [(f"{'return' if m == 'return' else 'steps'} per episode", f"auc_{m}"),
                          ("last 10% of episodes", f"final_{m}")],
    "continuing": lambda m: [("reward rate over the whole run", "reward_rate_all"),
                             ("last 10%", "reward_rate_last10")],
}


def check(spec, seeds, part=None) -> None:
    """Refuses a confirmation before any work, in one line naming
    `confirm_seeds` (`ValueError`): in a part (`--chunks`: the
    assembling `--resume` confirms), fewer than 2 seeds (no interval), a spec
    without `seed_offset`, and fresh streams past the last one
    (seed_offset + seeds + N <= 2**31 - 1)."""
    if part is not None:
        raise ValueError("confirm_seeds: a part computes chunks only; confirm when assembling (--resume)")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 2:
        raise ValueError(f"confirm_seeds: at least 2 seeds (for an interval), got {seeds!r}")
    offset = getattr(spec, "seed_offset", None)
    if offset is None:
        raise ValueError(f"confirm_seeds: a {kinds.of_spec(spec).name} sweep has no seed_offset to draw "
                              "fresh seeds from")
    first = offset + spec.seeds
    if first + seeds > MAX_INT32:
        raise ValueError(f"confirm_seeds: {seeds} fresh seeds after streams {offset}-{first - 1} pass the last "
                              f"stream (seed_offset + seeds <= 2**31 - 1); at most {MAX_INT32 - first}")


def one_point(spec, point: dict, seeds: int, seed_offset: int):
    """The spec of grid point `point` ({column: value}) of `spec` alone, on
    `seeds` seeds from stream `seed_offset`: a search becomes a full run of
    that point; everything else is `spec`'s. `ValueError` naming
    `confirm` where the point does not rebuild as one."""
    d = spec.to_dict()
    if "points" in d:  # a grid given as a list of points (a prediction sweep's)
        return spec.replace(points=[point], seeds=seeds, seed_offset=seed_offset, search=None)
    d = {k: v for k, v in d.items() if k != "kind"}
    holders = [d.get(k) or {} for k in ("hyperparameters", "task_axes", "task_params")]
    for name, v in point.items():
        holder = next((h for h in holders if name in h), None)
        if holder is not None:
            holder[name] = [v]  # a one-value axis keeps its column
        elif name in d:
            d[name] = v  # a loop setting given at the top level
        else:
            raise ValueError(f"confirm: grid column {name!r} is not a field of the sweep")
    if d.get("search") is not None:
        d["search"] = None
    d.update(seeds=seeds, seed_offset=seed_offset)
    new = kinds.of_spec(spec).spec.from_dict(d)
    if new.num_points != 1 or new.grid_points()[0] != point:
        raise ValueError(f"confirm: the point {point} does not rebuild as a sweep of its own")
    return new


def choices(result, metric=None) -> list[tuple[dict, int]]:
    """[(task values, grid point)]: what `confirm` re-runs, the result's best by
    `metric` (None: the kind's default; `Scores.chosen`), at each value of its task axes where the
    kind chooses there (`by_task_value`, a control result's), else once ({}).
    Points whose score is NaN are never chosen (every kind's `best_index`
    skips them: a search's points stopped early)."""
    kind = kinds.of_result(result)
    metric = kind.figures.check_metric({"": result}, metric)  # None: the kind's default
    parts = result.by_task_value() if hasattr(result, "by_task_value") else [({}, result)]
    return [(values, kind.scores.chosen({"": result}, metric, values or None)[""]) for values, _ in parts]


def confirm(result, out: str, seeds: int, metric: str | None = None, **sweep_kwargs) -> dict:
    """Re-runs the chosen point of `result` (`choices`) on `seeds` fresh seeds,
    disjoint from the ones that chose it (the streams after them:
    `seed_offset`), into `out/confirm/`, and writes `out/confirm.json` (see
    the module docstring); returns its content. `sweep_kwargs` go to the
    front's `run`. A point that cannot be chosen (every run of a control
    sweep's task value failed) gets a `note` instead."""
    spec = result.spec
    if spec is None:
        raise ValueError("confirm: the result's spec cannot be rebuilt here (its environment or algorithm "
                              "does not import)")
    check(spec, seeds)
    kind = kinds.of_result(result)
    metric = kind.figures.check_metric({"": result}, metric)
    try:
        chosen = choices(result, metric)
    except ValueError as e:  # no point can be chosen: the sweep's line says why
        chosen = [({}, str(e))]
    entries = []
    for k, (values, b) in enumerate(chosen):
        entry = {"task_values": values} if values else {}
        if isinstance(b, str):
            entries.append({**entry, "note": b})
            continue
        point = result.point(b)
        fresh = one_point(spec, spec.grid_points()[b], seeds, spec.seed_offset + spec.seeds)  # as typed
        again = kind.front.run(fresh, **sweep_kwargs)
        where = CONFIRM_DIR if len(chosen) == 1 else os.path.join(CONFIRM_DIR, str(k))
        if _is_writer():
            again.save(os.path.join(out, where))
        entries.append({**entry, "point": point, "run": where, "selection": numbers(result, b, metric),
                        "confirmation": numbers(again, 0, metric)})
    head = {"kind": kind.name, "metric": metric if metric is not None else result.metrics[0],
            "higher_is_better": bool(kind.scores.higher_is_better(metric)), "note": NOTE}
    report = {**head, **entries[0]} if len(entries) == 1 else {**head, "choices": entries}
    if _is_writer():
        write_json(os.path.join(out, CONFIRM_FILE), report)
    return report


def report(result, out: str, seeds: int | None, log=print, metric: str | None = None) -> dict | None:
    """With `seeds` (None or 0: nothing), `confirm` and `log` each line of
    `confirm_line`: what a command does after its sweep. Returns the report."""
    if not seeds:
        return None
    rep = confirm(result, out, seeds, metric)
    for line in confirm_line(rep, out).splitlines():
        log(line)
    return rep


def _is_writer() -> bool:
    """Only the first JAX process writes files (as `runner.is_writer`; the runner's layer is above this one)."""
    import jax
    return jax.process_index() == 0


def numbers(r, i: int, metric) -> dict:
    """The numbers confirm.json gives of grid point i of result `r`: its seeds
    and their streams, the kind's per-seed score with its 95% t interval, and
    the kind's summary of the point (see the module docstring)."""
    offset = int(r.spec_dict.get("seed_offset", 0))
    out = {"seeds": int(r.seeds), "seed_streams": [offset, offset + int(r.seeds) - 1]}
    try:
        s = np.asarray(kinds.of_result(r).scores.seed_scores(r, i, metric), np.float64)
        mean, lo, hi = t_interval(s[np.isfinite(s)])
        out.update(score=_num(mean), score_ci95=[_num(lo), _num(hi)], scored_seeds=int(np.isfinite(s).sum()))
    except ValueError:  # a result saved without per-seed scores
        pass
    if isinstance(r, SweepResult):  # the fields a prediction sweep's confirm.json has had since it had one
        f_lo, f_hi = r.ci("final", metric)
        a_lo, a_hi = r.ci("auc", metric)
        out.update(final=float(r.mean[r._m(metric), i, -1]), final_ci95=[float(f_lo[i]), float(f_hi[i])],
                   auc=float(r.auc(metric)[i]), auc_ci95=[float(a_lo[i]), float(a_hi[i])],
                   diverged_fraction=float(r.diverged_fraction[i]))
        return out
    rec = r.summary()[i]
    skip = {"task", "env", "algorithm", *r.grid}
    for key, v in rec.items():
        if key in skip or key.endswith(("_ci_low", "_ci_high")):
            continue
        out[key] = v
        if f"{key}_ci_low" in rec:
            out[f"{key}_ci95"] = [rec[f"{key}_ci_low"], rec[f"{key}_ci_high"]]
    return out


def _num(x) -> float | None:
    """A float, or None (null in JSON) where it is not finite."""
    return float(x) if x is not None and math.isfinite(x) else None


def _fmt(d: dict, key: str) -> str:
    """'0.4123 [0.39, 0.43]', or 'unbounded' for a number that is not finite."""
    v, (lo, hi) = d.get(key), d.get(key + "_ci95") or (None, None)
    if v is None or not math.isfinite(v):
        return "unbounded"
    bounds = ", ".join("-" if b is None or not math.isfinite(b) else f"{b:.4g}" for b in (lo, hi))
    return f"{v:.4g} [{bounds}]"


def _setting(point: dict) -> str:
    return ", ".join(f"{n}={v:g}" if isinstance(v, (int, float)) else f"{n}={v}" for n, v in point.items())


def confirm_line(rep: dict, out: str) -> str:
    """The lines on a `confirm` report (one per chosen point): the
    confirmation runs' numbers as the result, then the selection runs'
    (selection only), with their 95% intervals."""
    entries = rep.get("choices", [rep])
    return "\n".join(_line(rep, e, out) for e in entries)


def _line(rep: dict, e: dict, out: str) -> str:
    at = f" at {', '.join(f'{n}={v:g}' for n, v in e['task_values'].items())}" if e.get("task_values") else ""
    if "note" in e and "confirmation" not in e:
        return f"nothing to confirm{at}: {e['note']}"
    s, c = e["selection"], e["confirmation"]
    if rep.get("kind", "prediction") == "prediction":  # the line of 0.3
        return (f"confirmed on {c['seeds']} fresh seeds (streams {c['seed_streams'][0]}-{c['seed_streams'][1]}): "
                f"final {rep['metric']} {_fmt(c, 'final')} (selection run: {_fmt(s, 'final')}), AUC "
                f"{_fmt(c, 'auc')} (selection: {_fmt(s, 'auc')}); 95% intervals; wrote {out}/{CONFIRM_FILE}, "
                f"{out}/{CONFIRM_DIR}/")
    quoted = QUOTED.get(rep["kind"], lambda m: [(f"score ({m})", "score")])(rep["metric"])
    result = ", ".join(f"{label} {_fmt(c, key)}" for label, key in quoted)
    selection = ", ".join(f"{label} {_fmt(s, key)}" for label, key in quoted)
    return (f"confirmed{at} on {c['seeds']} fresh seeds (streams {c['seed_streams'][0]}-{c['seed_streams'][1]}): "
            f"{_setting(e['point'])}: {result}; selection runs (streams {s['seed_streams'][0]}-"
            f"{s['seed_streams'][1]}, selection only): {selection}; 95% intervals; wrote {out}/{CONFIRM_FILE}, "
            f"{out}/{e['run']}/")
