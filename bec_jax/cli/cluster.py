"""The command line on clusters: `--submit slurm --parts N` of `bec-jax
run|control|continuing|study` and `bec-jax status DIR` (the command line's side
of `bec_jax.run.slurm`), and `--distributed` (`init_distributed`).

A submission runs the command as given, less the submission's own options
(and `--confirm-seeds`, which the assembling job does), in N parts
(`--chunks K/N`), then `bec-jax COMMAND --out DIR --resume` once every part
has succeeded."""
from __future__ import annotations

import json
import os
import shlex
import sys

from bec_jax.cli.args import UsageError, int_arg
from bec_jax.run import rundir
from bec_jax.run import slurm as jobs

# Options of the submitting command that its parts do not take: the submission's
# own (with and without a value) and the assembling job's confirmation.
_SUBMIT_ONLY = {"--submit": True, "--parts": True, "--slurm-option": True, "--confirm-seeds": True}
_REFUSED = ("chunks", "distributed", "overwrite", "resume")


def init_distributed(text: str) -> tuple[int, int]:
    """Joins this process to a `jax.distributed` run (before any JAX computation):
    'auto' detects Slurm or Open MPI; 'HOST:PORT,N,ID' names the coordinator, the
    number of processes and this process's index. CPU processes exchange results
    over gloo. Returns (process index, process count)."""
    import jax
    parts = [x.strip() for x in text.split(",")]
    if text.strip() == "auto":
        kwargs = {}
    elif len(parts) == 3 and ":" in parts[0] and parts[1].isdigit() and parts[2].isdigit():
        kwargs = {"coordinator_address": parts[0], "num_processes": int(parts[1]), "process_id": int(parts[2])}
        if not 0 <= kwargs["process_id"] < kwargs["num_processes"]:
            raise UsageError(f"distributed: the process index must be in [0, N), got {text!r}")
    else:
        raise UsageError(f"distributed: expected 'auto' or HOST:PORT,N,ID (e.g. 10.0.0.1:1234,4,0), got {text!r}")
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"distributed: cannot join the run ({str(e).splitlines()[0]})") from None
    if jax.process_index() != 0:  # one report, from process 0
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    return jax.process_index(), jax.process_count()


def leave_distributed() -> None:
    """Ends this process's part in a `jax.distributed` run, waiting for the
    others: process 0 leaving first takes the coordination service with it and
    the others abort (and `srun` reports a failure)."""
    import jax
    jax.distributed.shutdown()


def slurm_option_arg(text: str) -> tuple:
    """--slurm-option's KEY=VALUE, checked (`run.slurm.parse_option`)."""
    import argparse
    try:
        return jobs.parse_option(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_submit_options(p) -> None:
    """--submit, --parts and --slurm-option on a subcommand that takes --chunks."""
    p.add_argument("--submit", choices=("slurm",),
                   help="submit the command as a Slurm job array of --parts parts (--chunks K/N each) and an "
                        "assembling job that waits for them (sbatch; scripts and logs in OUT/slurm/); "
                        "`bec-jax status OUT` follows them")
    p.add_argument("--parts", type=int_arg("parts"), metavar="N", help="with --submit: the number of parts")
    p.add_argument("--slurm-option", action="append", type=slurm_option_arg, metavar="KEY=VALUE", default=[],
                   help="with --submit: an #SBATCH option of both jobs, e.g. time=01:00:00, partition=gpu, "
                        "gres=gpu:1 (repeatable)")


def add_status(sub, command) -> None:
    """The `bec-jax status` subcommand and its options."""
    st = sub.add_parser("status", help="which parts of a run or study are done, running, failed or missing",
                        allow_abbrev=False)
    st.add_argument("dir", help="the run's or study's --out directory")
    st.add_argument("--parts", type=int_arg("parts"), metavar="N",
                    help="the number of parts (default: the submission's; without one, the chunks alone)")
    st.add_argument("--json", action="store_true", help="print JSON instead of text")
    st.set_defaults(func=command)


def part_argv(argv: list[str]) -> list[str]:
    """`argv` without the options a part does not take (`_SUBMIT_ONLY`, in
    either form: `--parts 4` and `--parts=4`)."""
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = tok.partition("=")
        if name in _SUBMIT_ONLY:
            skip = _SUBMIT_ONLY[name] and not eq
            continue
        out.append(tok)
    return out


def assemble_argv(args, command: str) -> list[str]:
    """The assembling job's command line: `COMMAND --out DIR --resume`, with
    the confirmation, device and stall timeout the command was given."""
    argv = [command, "--out", args.out, "--resume"]
    if getattr(args, "confirm_seeds", None):
        argv += ["--confirm-seeds", str(args.confirm_seeds)]
    if getattr(args, "device", "auto") != "auto":
        argv += ["--device", args.device]
    if getattr(args, "stall_timeout", None) is not None:
        argv += ["--stall-timeout", str(args.stall_timeout)]
    return argv


def _check_args(args) -> None:
    if args.parts is None:
        raise UsageError("parts: --submit slurm needs --parts N (the number of parts of the job array)")
    jobs.check_parts(args.parts)
    for name in _REFUSED:
        if getattr(args, name, None):
            raise UsageError(f"{name}: --submit runs the parts and the assembling job itself; leave --"
                             f"{name.replace('_', '-')} out (to continue a submission, submit the same command "
                             "again: its parts keep what they saved)")


def _check_out(spec, out: str, chunk_size) -> None:
    """Before anything is submitted: `out` is empty, or holds this very run's
    chunk store (the same command submitted again continues it)."""
    from bec_jax.run import runner
    if os.path.isfile(os.path.join(out, "curves.npz")):
        raise UsageError(f"out: {out!r} holds a finished run; choose another directory")
    if rundir.ChunkStore(out).exists():
        runner.check_resume(spec, out, chunk_size)  # names the field that differs
    elif os.path.isdir(out) and rundir.entries(out):
        raise UsageError(f"out: {out!r} is not empty and holds no chunk store of this sweep; choose another "
                         "directory")


def _check_study_out(st, out: str) -> None:
    from bec_jax.run import study
    if rundir.SUBMIT_DIR in st.names:
        raise UsageError(f"study: a sweep named {rundir.SUBMIT_DIR!r} would share its directory with the "
                         "submission's files; rename it")
    old = study.saved(out)
    if old is not None and old.to_dict() != st.to_dict():
        raise UsageError(f"study: differs from the study in {out!r}; submit the same file or another --out")
    if old is None and os.path.isdir(out) and rundir.entries(out):
        raise UsageError(f"out: {out!r} is not empty and holds no study; choose another directory")


def submit(args, spec, command: str) -> int:
    """`--submit slurm`: checks the command (`spec`: its sweep spec, or the
    study for `study`) and `--out`, submits its parts and assembling job
    (`run.slurm.submit`), and says how to follow them. Returns 0."""
    _check_args(args)
    from bec_jax.run import study
    if getattr(spec, "search", None) is not None or (command == "study" and spec is not None and study.searches(spec)):
        raise rundir.RunError("submit: a search runs every grid point in one compiled call, not in parts; run it "
                              f"as one job (sbatch --wrap 'bec-jax {command} ... --search halving')")
    jobs.check_can_submit()
    if getattr(args, "confirm_seeds", None):  # the assembling job's confirmation, refused before any submission
        from bec_jax.run import confirm
        (study.check_confirmable if command == "study" else confirm.check)(spec, args.confirm_seeds)
    if command == "study":
        _check_study_out(spec, args.out)
    else:
        _check_out(spec, args.out, args.chunk_size)
    rec = jobs.submit(args.out, part_argv(args.argv), assemble_argv(args, command), args.parts,
                      args.slurm_option, kind=command, again=args.argv)
    d = os.path.join(args.out, rundir.SUBMIT_DIR)
    print(f"submitted {args.parts} parts as job array {rec['array_job']} and the assembling job "
          f"{rec['assemble_job']} (it starts when every part has succeeded)")
    print(f"follow them: bec-jax status {shlex.quote(args.out)}   (or squeue -j "
          f"{rec['array_job']},{rec['assemble_job']}); scripts and logs: {d}/")
    return 0


def cmd_status(args) -> int:
    """`bec-jax status DIR`: the state of each part and of the assembling job."""
    st = jobs.status(args.dir, args.parts)
    print(json.dumps(jobs.status_dict(st), indent=1) if args.json else jobs.status_text(st))
    return 0
