"""The `bec-jax` console script (and `python -m bec_jax`): `--version` is
answered before the command line's modules, and JAX with them, are imported;
everything else is `bec_jax.cli.commands.main`."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    """`bec_jax.cli.commands.main(argv)`, except `--version` alone: printed at once."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        from bec_jax.cli.catalog import version_text
        print(version_text())
        return 0
    from bec_jax.cli.commands import main as cli_main
    try:
        rc = cli_main(argv)
    except BrokenPipeError:  # the reader of its output left (`bec-jax list | head`): quiet, as a shell tool
        _drop_stdout()
        rc = 141  # 128 + SIGPIPE, what a shell reports for a writer whose pipe closed
    if argv is None and "jax" in sys.modules:
        _exit_now(rc)
    return rc


def _drop_stdout() -> None:
    """Points stdout at /dev/null, so that the interpreter's last flush of a
    closed pipe raises nothing (the Python documentation's advice on SIGPIPE)."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit_now(rc) -> None:
    """Ends the command-line process once its work is written: the
    interpreter's teardown of JAX's objects (compiled programs, the CPU
    client's threads) takes 0.3-0.4 s that the command does not need. Every
    file the command writes is closed by then, its worker processes are shut
    down and its threads joined; the streams are flushed here."""
    import os
    code = rc if isinstance(rc, int) else (0 if rc is None else 1)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
