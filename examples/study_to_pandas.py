"""A study (several sweeps from one TOML file) run and read into pandas.

    python examples/study_to_pandas.py [OUT]      (needs pandas: pip install 'bec_jax[pandas]')

The same study from the command line: `bec-jax study FILE.toml --out OUT`, then
`bec-jax plot OUT`. `study.load_frame(OUT)` reads every finished sweep into one
long table: a row per sweep x grid point x metric x logged step, with the mean
over seeds, its 95% interval and the number of seeds still alive.
"""
import os
import sys
import tempfile
import tomllib

from bec_jax.run import study

STUDY = """
seeds = 10
steps = 1000
log_every = 100
metrics = ["rmscbe", "rmsve"]
env = "boyan_chain"

[[sweep]]
name = "td"
algorithm = "td"
alpha = [0.05, 0.2]

[[sweep]]
name = "ctd"
algorithm = "ctd"
alpha = [0.05, 0.2]
beta = [0.1]
"""


def main(out=None):
    """Runs the study into `out` (default: a temporary directory); prints and returns its frame."""
    out = out or os.path.join(tempfile.mkdtemp(), "study")
    study.run(study.from_dict(tomllib.loads(STUDY)), out)
    frame = study.load_frame(out)
    last = frame[(frame.step == frame.step.max()) & (frame.metric == "rmscbe")]
    table = last.pivot_table(index="alpha", columns="sweep", values="mean")
    print(f"the study is in {out} (bec-jax plot {out} draws it)")
    print(f"{len(frame)} rows; columns: {', '.join(frame.columns)}")
    print(f"final RMSCBE (mean over {frame.alive.max()} seeds) by alpha and sweep:\n{table.round(4)}")
    best = last.loc[last.groupby("sweep")["mean"].idxmin(), ["sweep", "alpha", "mean", "ci_low", "ci_high"]]
    print(f"the best alpha of each sweep, with its 95% interval:\n{best.round(4).to_string(index=False)}")
    return frame, out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
