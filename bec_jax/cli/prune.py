"""`bec-jax run ... --prune theory`: the command line's side of
`prediction.prune`.

`pruned_spec` (called where `bec-jax run` builds its spec) runs the exact
analysis, prints the listing of the skipped points and hands on the spec of
the points that run; a refusal is one line before anything is written.
`recording` wraps the run command: once the run directory holds this run
(finished, a `--chunks` part done, or stopped or failed with its chunks kept),
the report goes to DIR/pruned.json, so a later `bec-jax run --out DIR
--resume` (which takes the saved spec, the pruned one) still has it. A
resume given the whole command again prunes again, to the same points (the
analysis is deterministic), and the chunk store checks that the spec matches.
"""
from __future__ import annotations

import argparse
import functools
import json
import os

from bec_jax.files import META_FILE, writing
from bec_jax.prediction import prune


def method_arg(text: str) -> str:
    """--prune's value: one of `prune.METHODS`."""
    try:
        return prune.check_method(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pruned_spec(args, spec):
    """`spec` less the points `prune.prune` skips when `args.prune` is given
    (the listing printed, the report kept in `args.pruning`); else `spec`,
    except on a --resume of a run that pruned this very grid, refused in one
    line (its chunk store holds the pruned spec: the whole grid would not
    match it)."""
    method = getattr(args, "prune", None)
    if method is None:
        saved = prune.load(args.out) if getattr(args, "resume", False) and getattr(args, "out", None) else None
        if saved is not None and _canonical(saved.get("grid_spec")) == _canonical(spec.to_dict()):
            raise ValueError(f"prune: the run in {args.out!r} ran this grid pruned ({prune.PRUNED_FILE}); resume "
                             f"it with --prune {saved.get('method', 'theory')}, or with --out and --resume alone")
        return spec
    result = prune.prune(spec, method)
    print(prune.listing(result.report), flush=True)
    args.pruning = result.report
    return result.spec


def _canonical(spec_dict) -> str:
    return json.dumps(spec_dict, sort_keys=True)


def _spec_in(out: str) -> tuple[dict | None, bool]:
    """(the spec of the run in `out`, whether it is finished): the chunk
    store's while it has one (a run under way or stopped), else meta.json's."""
    from bec_jax.run import rundir
    manifest = os.path.join(out, rundir.CHUNKS_DIR, rundir.MANIFEST_FILE)
    running = os.path.isfile(manifest)
    try:
        with open(manifest if running else os.path.join(out, META_FILE)) as f:
            return json.load(f)["spec"], not running
    except (OSError, ValueError, KeyError, TypeError):
        return None, False


def record(args, finished_ok: bool = True) -> None:
    """Writes `args.pruning` as DIR/pruned.json once DIR (`args.out`) holds
    the run of its spec. After a run with --overwrite that prunes nothing
    (`finished_ok`: the command succeeded), removes the pruned.json of the
    run it replaced. Only the first JAX process writes."""
    out = getattr(args, "out", None)
    if not out or not os.path.isdir(out):
        return
    import jax
    if jax.process_index() != 0:
        return
    ran, finished = _spec_in(out)
    report = getattr(args, "pruning", None)
    if ran is None:
        return
    with writing(prune.PRUNED_FILE, out):
        if report is not None and _canonical(ran) == _canonical(report["run_spec"]):
            prune.save(out, report)
        elif report is None and finished and finished_ok and getattr(args, "overwrite", False):
            try:
                saved = prune.load(out)
            except ValueError:
                saved = {}
            if saved is not None and _canonical(saved.get("run_spec")) != _canonical(ran):
                os.remove(os.path.join(out, prune.PRUNED_FILE))


def recording(command):
    """`command` (`bec-jax run`'s), then `record`: also when it stops or
    fails, so the chunks a resume continues from keep their listing."""
    @functools.wraps(command)
    def run(args):
        try:
            rc = command(args)
        except BaseException:
            try:
                record(args, finished_ok=False)
            except ValueError:
                pass  # the command's own error is the one to report
            raise
        record(args)
        return rc
    return run
