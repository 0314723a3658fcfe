"""Figures and tables of saved runs of any kind: each result goes to the
figures of its kind (`kinds.KINDS`: `bec_jax.prediction.plotting` for
prediction sweeps, `bec_jax.control.plotting` for control sweeps), so `bec-jax plot` and
`bec-jax compare` take run and study directories of either kind, and a study
that holds both.

    results = {"q": kinds.load_result("runs/q"), "cq": kinds.load_result("runs/cq")}
    figures.compare_figure(results)                  # their best curves on one panel
    figures.plot_results(results, "runs/plots")      # figures, table.md, table.csv
"""
from __future__ import annotations

from bec_jax.prediction import plotting
from bec_jax.run import kinds


def by_kind(results: dict) -> dict[str, dict]:
    """{kind: {key: result}} of `results`, each kind in order of first appearance."""
    out: dict[str, dict] = {}
    for key, r in results.items():
        out.setdefault(r.KIND, {})[key] = r
    return out


def compare_figure(results: dict, metric: str | None = None, title: str = "", select: dict | None = None):
    """One panel with the best curve of each result (or the best of the points
    `select` names), labelled by its key. Every result must be of one kind:
    `ValueError` naming `dirs` otherwise (a prediction error curve and a control
    return curve share no axis)."""
    groups = by_kind(results)
    if len(groups) > 1:
        first = [f"{next(iter(rs))!r} is a {kind} run" for kind, rs in groups.items()]
        raise ValueError(f"dirs: compare takes runs of one kind, and {' but '.join(first)} (their curves share "
                         "no axis); compare each kind on its own")
    kind, = groups
    k = kinds.get(kind).figures
    return k.compare(results, k.check_metric(results, metric), title, select)


def plot_results(results: dict, out_dir: str, metric: str | None = None, select: dict | None = None,
                 confirmations: dict | None = None) -> list[str]:
    """Each kind's figures of `results` into `out_dir` (see
    `plotting.result_figures` and `control.plotting.plot_results`; with both
    kinds present, the control figures' names start with `control_`), and one
    table of every result's best setting with its 95% Student-t intervals over
    seeds: `table.md` (a table per kind) and `table.csv`. Returns the paths."""
    groups = by_kind(results)
    checked = {kind: kinds.get(kind).figures.check_metric(rs, metric) for kind, rs in groups.items()}  # before any file
    paths, tables = [], []
    for kind, rs in groups.items():
        k = kinds.get(kind).figures
        prefix = f"{kind}_" if len(groups) > 1 and kind != "prediction" else ""
        paths += k.figures(rs, out_dir, checked[kind], select, prefix)
        tables.append(k.rows(rs, checked[kind], confirmations))
    return paths + plotting.write_tables(out_dir, tables)
