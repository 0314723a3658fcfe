"""Exact quantities from the model matrices: expected updates, fixpoints, mean-square, metrics, verdicts."""
