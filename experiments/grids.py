"""The paper's step-size grids (Appendix A) and the `--quick` corner of each:
data the reproduction (`paper`) and the theory facts (`theory`) both read."""

# Appendix A: the step-size grids (alpha for all; zeta for TDC/CTDC; beta for CTD/CTDC).
PAPER = {
    "boyan_chain": dict(
        steps=1000, log_every=10,
        alpha=(1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.3),
        zeta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5),
        beta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.5)),
    "two_state": dict(
        steps=2000, log_every=20,
        alpha=(1e-4, 5e-4, 1e-3, 5e-3, 1e-2),
        zeta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2),
        beta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2)),
    "baird": dict(
        steps=2000, log_every=20,
        alpha=(1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2, 0.3),
        zeta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2),
        beta=(5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.2)),
}

# --quick: a few seeds, short runs and a corner of each grid; a smoke run, not evidence.
QUICK = {
    "boyan_chain": dict(steps=200, log_every=10, alpha=(1e-2, 0.1, 0.3), zeta=(1e-2, 0.1), beta=(1e-2, 0.1)),
    "two_state": dict(steps=400, log_every=20, alpha=(1e-3, 1e-2), zeta=(1e-2, 5e-2), beta=(1e-2, 0.1)),
    "baird": dict(steps=400, log_every=20, alpha=(1e-3, 1e-2, 0.3), zeta=(1e-2, 0.1), beta=(1e-2, 0.1)),
}
QUICK_SEEDS = 5
