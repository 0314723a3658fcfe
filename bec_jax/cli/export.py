"""`bec-jax export`: saved runs and studies to TensorBoard or to Weights &
Biases (offline), one exported run per grid point (and per seed with
--per-seed); the records and writers are `bec_jax.run.export`'s.

    bec-jax export DIR... --to tensorboard --out OUT [--per-seed] [--overwrite]
    bec-jax export DIR... --to wandb --out OUT [--project NAME] [--per-seed] [--overwrite]

Bad input (an unknown target, a missing extra, a directory with no run, a
non-empty OUT without --overwrite) is one line naming the field; nothing is
written. --overwrite deletes only what an earlier export listed in
OUT/bec_jax-export.json.
"""
from __future__ import annotations

import os
import shlex


def add_parser(sub, command) -> None:
    """The `bec-jax export` subcommand and its options, running `command`."""
    from bec_jax.run.export import TARGETS
    ex = sub.add_parser("export", help="runs or studies to TensorBoard or to Weights & Biases (offline)",
                        allow_abbrev=False)
    ex.add_argument("dirs", nargs="+", help="run directories and/or study directories")
    ex.add_argument("--to", required=True, choices=TARGETS,
                    help="tensorboard (event files; pip install 'bec_jax[tensorboard]') or wandb (offline runs; "
                         "pip install 'bec_jax[wandb]')")
    ex.add_argument("--out", required=True, help="the folder to write (tensorboard --logdir OUT; W&B: OUT/wandb)")
    ex.add_argument("--per-seed", action="store_true", help="also one run per seed of each grid point")
    ex.add_argument("--project", default="bec_jax", help="the W&B project (default bec_jax)")
    ex.add_argument("--overwrite", action="store_true",
                    help="write into a non-empty OUT, replacing what an earlier export wrote there")
    ex.set_defaults(func=command)


def sweep_dirs(dirs) -> dict[str, str]:
    """{sweep name: run directory} of run directories (named by their folder)
    and of the finished sweeps of study directories (by the study's sweep
    names, under the study's folder when several DIRs are given); `ValueError`
    naming `dirs` for one that holds neither, a name met twice, or nothing."""
    from bec_jax.files import CURVES_FILE
    from bec_jax.run import study
    paths: dict[str, str] = {}
    for d in dirs:
        base = os.path.basename(os.path.normpath(os.path.abspath(d)))
        if not os.path.isdir(d):
            raise ValueError(f"dirs: {d!r} is not a directory")
        if study.is_study_dir(d):
            found = {(n if len(dirs) == 1 else f"{base}/{n}"): p for n, p in study.sweep_dirs(d).items()}
        elif os.path.isfile(os.path.join(d, CURVES_FILE)):
            found = {base: d}
        else:
            raise ValueError(f"dirs: {d!r} holds neither a run (curves.npz) nor a study (study.json)")
        for name, path in found.items():
            if name in paths:
                raise ValueError(f"dirs: two runs would be exported as {name!r} ({paths[name]!r} and {path!r}); "
                                 "export them one at a time into different folders")
            paths[name] = path
    if not paths:
        raise ValueError("dirs: no finished sweep to export")
    return paths


def command(args) -> int:
    """`bec-jax export`: checks everything (the target's extra, the runs, OUT)
    before it writes; prints one line per sweep written and how to view or upload them."""
    from bec_jax.run import export, kinds, rundir
    export.require(args.to)
    if args.to == "wandb":
        export.check_project(args.project)
    results = {name: kinds.load_result(path) for name, path in sweep_dirs(args.dirs).items()}
    rundir.check_out_dir(args.out, args.overwrite)
    recs = export.export(results, args.to, args.out, per_seed=args.per_seed, project=args.project)
    label = "TensorBoard" if args.to == "tensorboard" else f"W&B offline (project {args.project})"
    for sweep in results:
        n = sum(r.sweep == sweep and r.seed is None for r in recs)
        seeds = sum(r.sweep == sweep and r.seed is not None for r in recs)
        where = os.path.join(args.out, sweep) if args.to == "tensorboard" else f"group {sweep!r}"
        print(f"wrote {n} {label} runs of {sweep}" + (f" and {seeds} per-seed runs" if seeds else "") + f": {where}")
    q = shlex.quote(args.out)
    print(f"view: tensorboard --logdir {q}" if args.to == "tensorboard"
          else f"upload: wandb sync {q}/wandb/offline-run-*")
    return 0
