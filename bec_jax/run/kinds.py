"""The one table of run kinds: what each kind of run is made of. A kind's
name (`spec.KIND`, `result.KIND`) gives its spec class, its result class, its
front (the `engine.protocol.Engine` module that plans and runs it), its figures
and the "kind" its saved spec dict carries. The runner, the study runner, the
figures and the command line ask this table and never a spec what it is.

    kinds.of_spec(spec).front.run(spec)       # plan and run any spec
    kinds.of_dict(saved).spec.from_dict(saved)  # rundir.spec_from_dict
    kinds.load_result("runs/x")               # a SweepResult or a ControlResult

Adding a front (continuing control was the third) is its package (spec, sweep,
results, plotting) plus one entry in `KINDS` here; nothing else names a kind.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Callable, NamedTuple

from bec_jax.control import plotting as control_plotting
from bec_jax.control import sweep as control_sweep
from bec_jax.control.continuing import plotting as continuing_plotting
from bec_jax.control.continuing import sweep as continuing_sweep
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.results import ControlResult
from bec_jax.control.spec import ControlSpec
from bec_jax.files import CURVES_FILE, read_meta
from bec_jax.prediction import plotting as prediction_plotting
from bec_jax.prediction import sweep as prediction_sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec


class Figures(NamedTuple):
    """What a kind gives `bec-jax plot` and `compare` (each takes results of
    its kind, {key: result}): check_metric(results, metric) -> the metric or
    None, raising `ValueError` naming `metric`; compare(results, metric, title,
    select) -> a figure; figures(results, out_dir, metric, select, prefix) ->
    paths; rows(results, metric, confirmations) -> table rows."""

    check_metric: Callable
    compare: Callable
    figures: Callable
    rows: Callable


class Scores(NamedTuple):
    """What a kind gives exports and robust statistics (each takes one result
    of its kind and a grid point i; `metric` as `Figures.check_metric` returns it):
    chosen(results, metric, select) -> {key: grid point}, each result's best
    (or the best of the points `select` names); seed_scores(result, i, metric)
    -> (N,) each seed's score (its area under the curve; NaN or inf for a
    failed run); seed_curves(result, i, metric) -> (x, (N, L)) each seed's
    curve, or None where the kind keeps only statistics over seeds;
    mean_curves(result, i) -> {tag: (x, y)} every curve it logs, as a mean over
    seeds; higher_is_better(metric) -> bool; task_of(result) -> the task's name."""

    chosen: Callable
    seed_scores: Callable
    seed_curves: Callable
    mean_curves: Callable
    higher_is_better: Callable
    task_of: Callable


def _scores(module) -> Scores:
    """A kind's `Scores`, the functions of that name in its figures' module."""
    return Scores(*(getattr(module, f) for f in ("chosen_points",) + Scores._fields[1:]))


class Kind(NamedTuple):
    """One kind of run.

    Attributes:
      name: the kind's name, its spec's and result's `KIND`.
      spec: the spec class (`from_dict`, `to_dict`).
      result: the result class (`load`, `save`).
      front: the module that plans and runs its specs (an `engine.protocol.Engine`).
      figures: its `Figures`.
      scores: its `Scores`.
      saved: the "kind" its saved spec dict carries (None: the dict has none,
        as every prediction run saved so far).
    """

    name: str
    spec: type
    result: type
    front: ModuleType
    figures: Figures
    saved: str | None
    scores: Scores


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("prediction", SweepSpec, SweepResult, prediction_sweep,
         Figures(prediction_plotting.check_metric, prediction_plotting.curves_figure,
                 prediction_plotting.result_figures, prediction_plotting.summary_rows), None,
         _scores(prediction_plotting)),
    Kind("control", ControlSpec, ControlResult, control_sweep,
         Figures(control_plotting.check_metric, control_plotting.compare_figure,
                 control_plotting.plot_results, control_plotting.summary_rows), "control",
         _scores(control_plotting)),
    Kind("continuing", ContinuingSpec, ContinuingResult, continuing_sweep,
         Figures(continuing_plotting.check_metric, continuing_plotting.compare_figure,
                 continuing_plotting.plot_results, continuing_plotting.summary_rows), "continuing",
         _scores(continuing_plotting)),
)}


def known_saved() -> str:
    """The "kind"s a saved spec dict may carry, for an error message:
    "'control' (or none: a prediction sweep)"."""
    named = ", ".join(repr(k.saved) for k in KINDS.values() if k.saved is not None)
    unnamed = [k.name for k in KINDS.values() if k.saved is None]
    return named + (f" (or none: a {unnamed[0]} sweep)" if unnamed else "")


def get(name: str) -> Kind:
    """The kind named `name`; `ValueError` naming `kind` when there is none."""
    if name not in KINDS:
        raise ValueError(f"kind: unknown kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def of_spec(spec) -> Kind:
    """The kind of a spec object (its `KIND`)."""
    return get(getattr(spec, "KIND", None))


def of_result(result) -> Kind:
    """The kind of a result object (its `KIND`)."""
    return get(getattr(result, "KIND", None))


def of_dict(d: dict) -> Kind:
    """The kind a saved spec dict describes (its "kind"; none: prediction);
    `ValueError` naming `kind` for an unknown one."""
    saved = d.get("kind") if isinstance(d, dict) else None
    for k in KINDS.values():
        if k.saved == saved:
            return k
    raise ValueError(f"kind: unknown kind of sweep {saved!r}; known: {known_saved()}")


def of_dir(out_dir: str) -> Kind:
    """The kind of the finished run in `out_dir` (its meta.json's spec);
    `ValueError` naming `dirs` when there is none or the kind is unknown."""
    spec = (read_meta(out_dir) or {}).get("spec")
    if not isinstance(spec, dict) or not os.path.isfile(os.path.join(out_dir, CURVES_FILE)):
        raise ValueError(f"dirs: {out_dir!r} holds no finished run (curves.npz and meta.json)")
    try:
        return of_dict(spec)
    except ValueError:
        raise ValueError(f"dirs: {out_dir!r} holds a run of an unknown kind {spec.get('kind')!r}; "
                         f"known: {known_saved()}") from None


def load_result(out_dir: str):
    """The result saved in `out_dir`, of whichever kind its spec names (a
    `SweepResult`, a `ControlResult`); `ValueError` naming `dirs` when there is
    none or the kind is unknown, or one line naming the damaged file (a
    truncated curves.npz, say) and how to get the results back
    (`outdir.damaged`), or while another process's run writes it
    (`outdir.check_not_writing`): every reader of saved runs reads them here."""
    import zipfile
    import zlib

    from bec_jax.files import result_problem
    from bec_jax.run import outdir
    kind = of_dir(out_dir)
    outdir.check_not_writing(out_dir)  # a run writing it (a --resume, an --overwrite) is about to change it
    try:
        return kind.result.load(out_dir)
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        found = result_problem(out_dir)
        if found is None:
            if isinstance(e, ValueError):  # one line already (an address-space limit, say)
                raise
            # Files that read, but not as this kind's result (another npz put in its place): name it.
            found = (os.path.join(out_dir, CURVES_FILE), f"not this run's arrays: {type(e).__name__}: {e}")
        raise outdir.damaged(out_dir, *found) from e
