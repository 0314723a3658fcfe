"""`python -m bec_jax.cli`, as in 0.3: the `bec-jax` command line."""
import sys

from bec_jax.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
