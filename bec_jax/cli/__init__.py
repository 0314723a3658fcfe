"""The `bec-jax` command line: `commands` (the subcommands and `main`),
`parser` (its options), `args` (options to specs), `analyze` (the exact
analysis command), `catalog` (what `bec-jax list` and `--version` print) and
`cluster` (`--submit slurm`, `bec-jax status`, `--distributed`), `export`
(`bec-jax export`) and `robust` (`--stat`, `compare --profile`)."""
import importlib as _importlib


def __getattr__(name: str):
    # bec_jax.cli was a module in 0.3: its functions live in bec_jax.cli.commands.
    moved = _importlib.import_module("bec_jax.moved")
    if name in moved.CLI_NAMES:
        home = moved.CLI_HOMES.get(name, "bec_jax.cli.commands")
        moved.warn(f"bec_jax.cli.{name}", f"{home}.{name}")
        return getattr(_importlib.import_module(home), name)
    raise AttributeError(f"module 'bec_jax.cli' has no attribute {name!r}")
