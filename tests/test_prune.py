"""`bec-jax run ... --prune theory` (`prediction.prune`, `cli.prune`): the
points skipped are those the exact mean-square analysis puts past the margin;
run anyway, every seed of each diverges, while the points kept do not (among
them TD on the 2-state example at alpha = 1 and 1.25, which the analysis says
diverge in mean, and whose runs converge: the margin's reason); the listing,
pruned.json, the result's loading and plotting, parts and resumes; bad input
in one line each.

One grid throughout, TD on the 2-state example (one feature: every run is
cheap), so the sweeps share their compiled programs."""
import json
import math
import os

import numpy as np
import pytest

from bec_jax.cli import analyze
from bec_jax.cli.commands import main
from bec_jax.prediction import prune, sweep
from bec_jax.prediction.spec import SweepSpec
from bec_jax.run import kinds
from bec_jax.theory import mean_square

ALPHAS = (0.01, 1.0, 1.25, 6.0, 8.0)
PRUNED = (6.0, 8.0)  # mean-square radius 10.1 and 17.4; the others 1.004, 1.58, 1.77
STEPS, SEEDS, LOG_EVERY = 400, 8, 20
SPEC = dict(env="two_state", algorithm="td", steps=STEPS, seeds=SEEDS, log_every=LOG_EVERY)
ARGS = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", ",".join(f"{a:g}" for a in ALPHAS),
        "--steps", str(STEPS), "--seeds", str(SEEDS), "--log-every", str(LOG_EVERY)]


@pytest.fixture(scope="module")
def spec():
    return SweepSpec(alpha=ALPHAS, **SPEC)


@pytest.fixture(scope="module")
def full(spec):
    """The whole grid, pruned points included, run as one sweep."""
    return sweep.run(spec, progress=False)


@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    """`bec-jax run ... --prune theory --out DIR`: (DIR, its stdout)."""
    out = str(tmp_path_factory.mktemp("pruned") / "run")
    cap = _Capture()
    with cap:
        assert main(ARGS + ["--prune", "theory", "--out", out]) == 0
    return out, cap.text


class _Capture:
    """stdout of a `main` call in a module-scoped fixture (capsys is per test)."""

    def __enter__(self):
        import contextlib
        import io
        self._buf = io.StringIO()
        self._cm = contextlib.redirect_stdout(self._buf)
        self._cm.__enter__()

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        self.text = self._buf.getvalue()


def test_the_rule_and_its_margin():
    big = 10**6
    below = np.nextafter(prune.MIN_RADIUS, 0)
    assert prune.diverges(prune.MIN_RADIUS, big, 1e6) and not prune.diverges(below, big, 1e6)
    assert not prune.diverges(math.nan, big, 1e6) and not prune.diverges(math.inf, 0, 1e6)
    # The horizon: 0.05 * log(rho) / 2 * steps >= log(bound).
    rho = 10.0
    need = math.log(1e6) / (prune.SAMPLE_RATE_RATIO * 0.5 * math.log(rho))
    assert prune.diverges(rho, math.ceil(need), 1e6) and not prune.diverges(rho, math.floor(need), 1e6)
    assert not prune.diverges(rho, math.ceil(need), 1e12)  # a larger bound needs more steps


def test_pruned_points_are_the_exact_analysis_verdicts(spec):
    result = prune.prune(spec)
    rows = result.report["points"]
    model = spec.mdp()
    table = analyze.analyze_grid("two_state", "td", {"alpha": list(ALPHAS)})  # what `bec-jax analyze` prints
    for r, a, row in zip(rows, ALPHAS, table):
        ms = mean_square.mean_square(model, "td", {"alpha": a}, "markov")
        assert r["point"] == {"alpha": a}
        assert r["mean_square_radius"] == ms.radius == row["mean_square_radius"]
        assert r["mean_radius"] == ms.mean_radius == row["mean_radius"]
        assert r["verdict"] == ms.label == row["verdict"] == "diverges in mean"  # every alpha, by the analysis
        past = ms.radius >= 5 and 0.05 * 0.5 * math.log(ms.radius) * STEPS >= math.log(spec.divergence_bound)
        assert r["pruned"] == past == (a in PRUNED)
    assert [p["point"]["alpha"] for p in result.pruned] == list(PRUNED)
    assert result.spec.grid_points() == [{"alpha": a} for a in ALPHAS if a not in PRUNED]
    assert result.spec.replace(points=None, alpha=ALPHAS) == spec  # all else as it was
    assert result.report["grid_spec"] == spec.to_dict() and result.report["run_spec"] == result.spec.to_dict()
    # Under i.i.d. sampling: that sampler's radii, the same rule.
    iid = prune.prune(spec.replace(sampler="iid")).report["points"]
    for r, a in zip(iid, ALPHAS):
        ms = mean_square.mean_square(model, "td", {"alpha": a}, "iid", stationary=False)
        assert r["mean_square_radius"] == ms.radius and r["pruned"] == prune.diverges(ms.radius, STEPS, 1e6)
    assert [r["point"]["alpha"] for r in iid if r["pruned"]] == list(PRUNED)
    # Fewer steps: the same radii, but the divergence would not show within the run: nothing is pruned.
    short = prune.prune(spec.replace(steps=100, log_every=20))
    assert not short.pruned and short.spec == spec.replace(steps=100, log_every=20)


def test_pruned_points_diverge_and_kept_ones_do_not(full):
    """The skipped points, run anyway: every seed leaves the divergence bound.
    The kept ones: no seed does; at alpha = 1 and 1.25 (both moments diverge by
    the analysis) every run converges to the fixpoint 0."""
    for i, a in enumerate(ALPHAS):
        ds = full.diverged_step[i]
        if a in PRUNED:
            assert full.diverged_fraction[i] == 1.0, a
            assert np.all((ds > 0) & (ds <= STEPS)) and np.all(full.final[:, i] == np.inf)
            assert full.alive[i, -1] == 0 and np.all(full.mean[:, i, full.alive[i] == 0] == np.inf)
        else:
            assert full.diverged_fraction[i] == 0.0 and np.all(ds == -1), a
            assert np.all(np.isfinite(full.mean[:, i]))
    start = full.mean[0, :, 0]
    for a in (1.0, 1.25):
        i = ALPHAS.index(a)
        assert full.final[0, i].max() < 1e-6 * start[i]


def test_the_run_lists_and_saves_the_pruned_points(pruned_dir, spec, full):
    out, text = pruned_dir
    expected = prune.prune(spec).report
    lines = text.splitlines()
    assert lines[0].startswith("--prune theory: of the 5 grid points, the exact mean-square analysis (markov "
                               "sampling) puts 2 past the margin")
    assert lines[0].endswith("skipping them, running the other 3:")
    for line, p in zip(lines[1:3], [p for p in expected["points"] if p["pruned"]]):
        assert line == (f"  skipped alpha={p['point']['alpha']:g}: mean-square radius {p['mean_square_radius']:.4g}, "
                        f"mean radius {p['mean_radius']:.4g} (diverges in mean)")
    assert "skipped alpha=6: mean-square radius 10.14" in text and "skipped alpha=8: mean-square radius 17.4" in text
    with open(os.path.join(out, prune.PRUNED_FILE)) as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(expected))
    assert prune.load(out) == saved
    # The result holds the points that ran, and loads, plots and compares as any sweep.
    r = kinds.load_result(out)
    kept = [i for i, a in enumerate(ALPHAS) if a not in PRUNED]
    np.testing.assert_array_equal(r.grid["alpha"], [ALPHAS[i] for i in kept])
    np.testing.assert_array_equal(r.mean, full.mean[:, kept])  # bit for bit the full grid's rows
    np.testing.assert_array_equal(r.diverged_step, full.diverged_step[kept])
    assert r.spec.to_dict() == saved["run_spec"]
    assert main(["plot", out, "--out", os.path.join(out, "..", "plots")]) == 0
    assert main(["compare", out, "--out", os.path.join(out, "..", "cmp.png")]) == 0


def test_parts_and_resumes_prune_the_same(pruned_dir, tmp_path, capsys):
    out, _ = pruned_dir
    want = kinds.load_result(out)
    with open(os.path.join(out, prune.PRUNED_FILE)) as f:
        report = json.load(f)
    small = ["--chunk-size", "1"]
    # Two parts, then `--out DIR --resume` alone assembles them: the saved (pruned) spec, the listing kept.
    a = str(tmp_path / "parts")
    for k in ("1/2", "2/2"):
        assert main(ARGS + small + ["--prune", "theory", "--out", a, "--chunks", k]) == 0
    assert json.load(open(os.path.join(a, prune.PRUNED_FILE))) == report  # written by each part
    assert main(["run", "--out", a, "--resume"]) == 0
    np.testing.assert_array_equal(kinds.load_result(a).mean, want.mean)
    assert json.load(open(os.path.join(a, prune.PRUNED_FILE))) == report
    # One part, then the whole command again: without --prune refused in one line, nothing changed;
    # with it, the same pruning recomputed matches the chunk store and the run completes.
    b = str(tmp_path / "resumed")
    assert main(ARGS + small + ["--prune", "theory", "--out", b, "--chunks", "1/2"]) == 0
    before = sorted(os.listdir(b)), sorted(os.listdir(os.path.join(b, "chunks")))
    capsys.readouterr()
    assert main(ARGS + small + ["--out", b, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bec-jax: error: prune: ") and "--prune theory" in err and len(err.splitlines()) == 1
    assert (sorted(os.listdir(b)), sorted(os.listdir(os.path.join(b, "chunks")))) == before
    assert main(ARGS + small + ["--prune", "theory", "--out", b, "--resume"]) == 0
    np.testing.assert_array_equal(kinds.load_result(b).mean, want.mean)
    assert json.load(open(os.path.join(b, prune.PRUNED_FILE))) == report
    # A run that prunes nothing, with --overwrite, leaves no pruned.json of the run it replaced.
    assert main(["run", "--env", "two_state", "--algorithm", "td", "--alpha", "0.01,1,1.25", "--steps", str(STEPS),
                 "--seeds", str(SEEDS), "--log-every", str(LOG_EVERY), "--out", b, "--overwrite"]) == 0
    assert not os.path.exists(os.path.join(b, prune.PRUNED_FILE))


SQUARED_TD = '''
from bec_jax.algorithms import Algorithm, step_size, td, td_error


def update(state, tr, alpha):
    d = td_error(state.theta, tr)
    return state._replace(theta=state.theta + alpha * d * d * tr.phi, count=state.count + 1)


SQUARED_TD = Algorithm(name="squared_td", init=td.init, update=update,
                       hyperparameters=(step_size("alpha", "a"),), equations="none (a test)")
'''


@pytest.mark.parametrize("extra, says", [
    (["--prune", "all"], "prune: unknown method 'all'; known: theory"),
    (["--prune", "theory", "--schedule", "robbins_monro"], "prune: --prune theory needs constant step sizes"),
    (["--prune", "theory", "--alpha", "6,8"], "prune: every one of the 2 grid points is predicted to diverge"),
    (["--prune", "theory", "--algorithm", "ctd_lambda", "--beta", "0.1", "--lambda", "0.5"],
     "prune: ctd_lambda carries traces (e) and the exact mean-square analysis covers one-step linear methods "
     "only; --prune theory takes ctd, ctdc,"),
    (["--prune", "theory", "--algorithm", "prune_squared_td:SQUARED_TD"],
     "prune: no exact analysis of prune_squared_td:SQUARED_TD on two_state at alpha=0.01 (grid point 0): "
     "algorithm: squared_td's update is not affine in its state"),
])
def test_bad_input_is_one_line_and_writes_nothing(extra, says, tmp_path, monkeypatch, capsys):
    (tmp_path / "prune_squared_td.py").write_text(SQUARED_TD)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = list(ARGS)
    for opt, *vals in ([extra[i], *extra[i + 1:i + 2]] for i in range(0, len(extra), 2)):
        if opt in args:  # replace the base command's value
            args[args.index(opt) + 1] = vals[0]
        else:
            args += [opt, *vals]
    out = tmp_path / "out"
    assert main(args + ["--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("bec-jax: error: " + says), cap.err
    assert len(cap.err.splitlines()) == 1 and "Traceback" not in cap.err and cap.out == ""
    assert not out.exists()


def test_the_margin_measurement_runs(capsys):
    """benchmarks/prune_margin.py, whose full run gave the margin's numbers, at
    its quick size: the 2-state TD at alpha = 1 and 1.25 is past the boundary
    (radius 1.58 and 1.77) and its runs converge; at alpha = 4 they grow."""
    from benchmarks import prune_margin
    prune_margin.main(["--quick"])
    out = capsys.readouterr().out
    assert "markov: 4 points past the boundary; the largest radius whose runs converge: 1.77" in out
    assert "radius >= 5: 1 points, least lambda / RMS rate 0.8" in out  # alpha = 4 (radius 5.28) grows
