"""The paper's experiments and worked examples, as definitions the `bec-jax` command runs."""
