"""The `bec-jax` console script (and `python -m bec_jax`): `--version` is
answered before the command line's modules, and JAX with them, are imported;
everything else is `bec_jax.cli.main`."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    """`bec_jax.cli.main(argv)`, except `--version` alone: printed at once."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        from bec_jax.catalog import version_text
        print(version_text())
        return 0
    from bec_jax.cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
