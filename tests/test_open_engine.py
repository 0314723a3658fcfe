"""The open engine: any hyperparameter and any environment parameter as a grid
axis, user MDPs from files and modules, user algorithms from Python and the
command line, and one compiled program per model shape."""
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import algorithms, envs
from bec_jax import mdp as mdp_lib
from bec_jax.cli import commands as cli
from bec_jax.engine import tuning
from bec_jax.prediction import streams, sweep
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import SweepSpec
from bec_jax.theory import expected_updates as analysis
from bec_jax.theory import fixpoints, metrics

SMALL = dict(seeds=6, steps=120, log_every=20)


def light():
    """The engine's light compile options on a CPU (None elsewhere), for the tests
    that count programs: a group of several models otherwise compiles with the
    fusion emitters, twice as long, and these tests are not about the options."""
    return tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None


class CompileCounter:
    """Counts the XLA programs compiled (or fetched from the persistent cache)
    while active, by the name of the jitted function."""

    def __init__(self, monkeypatch):
        from jax._src import compiler
        self.names = []
        orig = compiler.compile_or_get_cached

        def counting(backend, computation, *a, **k):
            self.names.append(str(computation.operation.attributes["sym_name"]).strip('"'))
            return orig(backend, computation, *a, **k)

        monkeypatch.setattr(compiler, "compile_or_get_cached", counting)

    def count(self, name="sweep_program"):
        return sum(name in n for n in self.names)


# ------------------------------------------------------------------ lambda as a grid axis

@pytest.fixture(scope="module")
def lambda_sweep():
    spec = SweepSpec(env="two_state", algorithm="ctd_lambda", alpha=(0.01, 0.05), beta=(0.1,),
                     lambda_=(0.0, 0.5, 0.9), metrics=("rmscbe", "rmsve"), **SMALL)
    return sweep.run(spec)


def test_lambda_zero_is_ctd(lambda_sweep):
    r = lambda_sweep
    assert list(r.grid) == ["alpha", "beta", "lambda"]
    ctd = sweep.run(SweepSpec(env="two_state", algorithm="ctd", alpha=(0.01, 0.05), beta=(0.1,),
                              metrics=("rmscbe", "rmsve"), **SMALL))
    lam0 = np.flatnonzero(r.grid["lambda"] == 0.0)
    # Two programs (the trace e = phi at lambda = 0 is exact, but XLA may contract
    # the two updates' multiply-adds differently on another CPU): equal to rounding.
    np.testing.assert_allclose(r.mean[:, lam0], ctd.mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(r.final[:, lam0], ctd.final, rtol=1e-5, atol=1e-7)
    # lambda > 0 is a different recursion (not a relabelled copy).
    lam9 = np.flatnonzero(r.grid["lambda"] == 0.9)
    assert not np.allclose(r.final[:, lam9], ctd.final)


def test_lambda_positive_matches_a_hand_computed_trace(lambda_sweep):
    """Grid point (alpha 0.05, lambda 0.5), seed 3: the sweep's final RMSVE equals a
    NumPy loop of z = rho (gamma lambda z + phi), theta += alpha (delta - omega) z,
    omega += beta rho (delta - omega) over the same transitions."""
    r = lambda_sweep
    i = int(np.flatnonzero((r.grid["alpha"] == 0.05) & (r.grid["lambda"] == 0.5))[0])
    env = envs.make("two_state")
    trs = jax.tree.map(lambda x: np.asarray(x, np.float64), streams.seed_transitions(r.spec, 3))
    theta, e, omega = np.asarray(env.theta0, np.float64), np.zeros(1), 0.0
    for phi, rew, g, phi2, rho in zip(*trs):
        delta = rew + g * phi2 @ theta - phi @ theta
        z = rho * (e + phi)
        theta = theta + 0.05 * (delta - omega) * z
        omega = omega + 0.1 * rho * (delta - omega)
        e = g * 0.5 * z
    np.testing.assert_allclose(r.final[1, i, 3], metrics.rmsve(env, theta), rtol=1e-4)


def test_lambda_out_of_range_and_undeclared():
    with pytest.raises(ValueError, match=r"lambda: must be in \[0, 1\], got 1.2"):
        SweepSpec(env="two_state", algorithm="ctd_lambda", alpha=0.1, beta=0.1, lambda_=(0.5, 1.2))
    with pytest.raises(ValueError, match="lambda: ctd does not take lambda"):
        SweepSpec(env="two_state", algorithm="ctd", alpha=0.1, beta=0.1, hyperparameters={"lambda": 0.5})


# ------------------------------------------------------------------ gamma as a grid axis

GAMMAS = (0.5, 0.8, 0.95)


@pytest.fixture(scope="module")
def gamma_sweep():
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", env_params={"gamma": GAMMAS}, alpha=(0.05, 0.2),
                     beta=(0.1,), zeta=(0.05,), metrics=("rmscbe", "rmsve"), **SMALL)
    return sweep.run(spec)


def test_gamma_grid_starts_at_each_closed_form(gamma_sweep):
    r = gamma_sweep
    assert list(r.grid) == ["gamma", "alpha", "beta", "zeta"]
    np.testing.assert_array_equal(r.grid["gamma"], np.repeat(GAMMAS, 2))
    for i in range(r.num_points):
        env = envs.make("boyan_chain", gamma=float(r.grid["gamma"][i]))
        for m, name in enumerate(r.metrics):
            want = metrics.metric(env, name)
            exact = float(np.linalg.norm(want.R @ env.theta0 + want.h))
            assert r.mean[m, i, 0] == pytest.approx(exact, rel=2e-6)  # float32 of the closed form
            assert r.std[m, i, 0] == 0  # every seed starts at theta0
    # The closed forms differ with gamma, so the check above is not vacuous.
    assert len(set(np.round(r.mean[1, ::2, 0], 4))) == 3


@pytest.fixture(scope="module")
def gamma_alone(gamma_sweep):
    """The fixture's grid run alone (one model) at gamma 0.5 and at 0.95."""
    return {g: sweep.run(gamma_sweep.spec.replace(env_params={"gamma": g})) for g in (0.5, 0.95)}


def test_each_gamma_equals_its_own_run_bitwise(gamma_sweep, gamma_alone):
    r = gamma_sweep
    for g, alone in gamma_alone.items():
        idx = np.flatnonzero(r.grid["gamma"] == g)
        np.testing.assert_array_equal(r.mean[:, idx], alone.mean)
        np.testing.assert_array_equal(r.std[:, idx], alone.std)
        np.testing.assert_array_equal(r.final[:, idx], alone.final)
        np.testing.assert_array_equal(r.diverged_step[idx], alone.diverged_step)


def test_env_parameter_sweep_is_one_program(monkeypatch):
    counter = CompileCounter(monkeypatch)
    spec = SweepSpec(env="two_state", algorithm="ctd", env_params={"gamma": (0.5, 0.9), "a": (0.3, 0.5)},
                     alpha=(0.01,), beta=(0.1,), **SMALL)
    r = sweep.run(spec, chunk_size=8, compiler_options=light())
    assert counter.count() == 1 and r.meta["compiled_programs"] == 1 and r.meta["num_programs"] == 1
    assert r.num_points == 4 and len(r.meta["env_fingerprints"]) == 4
    # Grid order: environment parameters first, in the order given, the last fastest.
    assert [(p["gamma"], p["a"]) for p in spec.grid_points()] == [(0.5, 0.3), (0.5, 0.5), (0.9, 0.3), (0.9, 0.5)]


def two_shapes(n: int = 2, gamma: float = 0.9):
    """A user factory whose parameter changes the model's shape: a ring of n states."""
    P = np.zeros((n, 1, n))
    P[np.arange(n), 0, (np.arange(n) + 1) % n] = 1.0
    return mdp_lib.make_mdp(pi=np.ones((n, 1)), mu=np.ones((n, 1)), P=P,
                            R=np.arange(n, dtype=float)[:, None].repeat(n, 1)[:, None, :],
                            phi=np.eye(n)[:, :1] + 0.5, gamma=gamma)


def test_differing_shapes_compile_separately(monkeypatch):
    counter = CompileCounter(monkeypatch)
    spec = SweepSpec(env=f"{__name__}:two_shapes", algorithm="td", env_params={"n": (2, 3), "gamma": (0.5, 0.9)},
                     alpha=(0.1,), **SMALL)
    r = sweep.run(spec, compiler_options=light())
    assert counter.count() == 2 and r.meta["num_programs"] == 2
    for n in (2, 3):
        alone = sweep.run(spec.replace(env_params={"n": n, "gamma": (0.5, 0.9)}), compiler_options=light())
        np.testing.assert_array_equal(r.mean[:, r.grid["n"] == n], alone.mean)


# ------------------------------------------------------------------ user MDPs from outside

def custom_mdp():
    """An off-policy 3-state MDP with rewards, as a user would write one."""
    P = np.array([[[0.2, 0.8, 0.0], [0.0, 0.1, 0.9]],
                  [[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]],
                  [[0.0, 0.3, 0.7], [0.4, 0.6, 0.0]]])
    return dict(pi=np.array([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]]), mu=np.full((3, 2), 0.5), P=P,
                R=np.arange(18, dtype=float).reshape(3, 2, 3) / 10.0 - 0.5,
                phi=np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]), gamma=0.9, theta0=np.array([1.0, -1.0]))


def user_factory(gamma: float = 0.9):
    return mdp_lib.make_mdp(**dict(custom_mdp(), gamma=gamma))


def write_toml(path, fields):
    def fmt(v):
        return json.dumps(np.asarray(v).tolist())
    path.write_text("".join(f"{k} = {fmt(v)}\n" for k, v in fields.items()))


@pytest.fixture()
def mdp_files(tmp_path, monkeypatch):
    fields = custom_mdp()
    np.savez(tmp_path / "mdp.npz", **fields)
    write_toml(tmp_path / "mdp.toml", fields)
    (tmp_path / "user_mdp_mod.py").write_text(textwrap.dedent("""
        import numpy as np
        from bec_jax.mdp import make_mdp
        def build(gamma=0.9):
            P = np.array([[[0.2, 0.8, 0.0], [0.0, 0.1, 0.9]],
                          [[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]],
                          [[0.0, 0.3, 0.7], [0.4, 0.6, 0.0]]])
            return make_mdp(pi=np.array([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]]), mu=np.full((3, 2), 0.5), P=P,
                            R=np.arange(18, dtype=float).reshape(3, 2, 3) / 10.0 - 0.5,
                            phi=np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]), gamma=gamma,
                            theta0=np.array([1.0, -1.0]))
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_user_mdp_from_npz_toml_and_module_give_identical_results(mdp_files, capsys):
    """The same model from a .npz, a TOML file and a module's factory, its gamma
    set by --env-param (one value: one model, one program shared by the three)."""
    outs = {}
    for label, source in (("npz", "mdp.npz"), ("toml", "mdp.toml"), ("mod", "user_mdp_mod:build")):
        out = mdp_files / f"out_{label}"
        code = cli.main(["run", "--env", source, "--algorithm", "ctd", "--alpha", "0.05,0.1", "--beta", "0.1",
                         "--env-param", "gamma=0.8", "--steps", "100", "--seeds", "4", "--log-every", "20",
                         "--metrics", "rmscbe,rmsve", "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        outs[label] = SweepResult.load(str(out))
    ref = outs["npz"]
    assert ref.num_points == 2 and np.all(np.isfinite(ref.mean))
    for label in ("toml", "mod"):
        np.testing.assert_array_equal(outs[label].mean, ref.mean)
        np.testing.assert_array_equal(outs[label].final, ref.final)
    # And the model is the one written, at the gamma given: step 0 is its closed-form
    # RMSVE at theta0, which at the file's own gamma (0.9) is another number.
    env = mdp_lib.make_mdp(**dict(custom_mdp(), gamma=0.8))
    assert ref.mean[1, 0, 0] == pytest.approx(metrics.rmsve(env, env.theta0), rel=2e-6)
    assert ref.mean[1, 0, 0] != pytest.approx(metrics.rmsve(user_factory(0.9), env.theta0), rel=1e-3)
    assert envs.parameters("mdp.npz") == {"gamma": 0.9}


def _bad_npz(path, **changes):
    fields = custom_mdp()
    for k, v in changes.items():
        if v is None:
            fields.pop(k)
        else:
            fields[k] = v
    np.savez(path, **fields)


@pytest.mark.parametrize("case,field", [
    ("missing", "P: missing"),
    ("rowsum", "P: each row must sum to 1"),
    ("shape", "phi: expected shape (S, k)"),
    ("unknown", "foo: unknown field"),
    ("directory", "not a file"),
    ("absent", "no such file"),
    ("unreadable", "cannot read it"),
    ("toml_rowsum", "mu: each row must sum to 1"),
    ("toml_syntax", "cannot read it"),
])
def test_malformed_mdp_files_exit_2_with_one_line(tmp_path, capsys, case, field):
    path = tmp_path / "bad.npz"
    if case == "missing":
        _bad_npz(path, P=None)
    elif case == "rowsum":
        P = custom_mdp()["P"].copy()
        P[1, 0, 0] = 0.7
        _bad_npz(path, P=P)
    elif case == "shape":
        _bad_npz(path, phi=np.ones((2, 2)))
    elif case == "unknown":
        _bad_npz(path, foo=np.ones(3))
    elif case == "directory":
        path = tmp_path / "dir.npz"
        path.mkdir()
    elif case == "absent":
        path = tmp_path / "nowhere.npz"
    elif case == "unreadable":
        path.write_bytes(b"this is not a zip file")
    elif case == "toml_rowsum":
        path = tmp_path / "bad.toml"
        fields = custom_mdp()
        fields["mu"] = np.full((3, 2), 0.4)
        write_toml(path, fields)
    elif case == "toml_syntax":
        path = tmp_path / "bad.toml"
        path.write_text("pi = [[1, 0]\n")
    out = tmp_path / "out"
    code = cli.main(["run", "--env", str(path), "--algorithm", "td", "--alpha", "0.1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bec-jax: error: env: "), err
    assert str(path) in lines[0] and field in lines[0], lines[0]
    assert not out.exists()  # nothing written


def test_episodic_user_mdp_runs_and_starts_at_closed_form(tmp_path):
    """Transition-dependent discounting: a 3-state chain whose last transition ends
    the episode (gamma = 0, back to the start) goes through a sweep."""
    P = np.zeros((3, 1, 3))
    P[0, 0, 1] = P[1, 0, 2] = P[2, 0, 0] = 1.0
    gamma = np.ones((3, 1, 3))
    gamma[2, 0, 0] = 0.0
    R = np.zeros((3, 1, 3))
    R[2, 0, 0] = 1.0
    env = mdp_lib.make_mdp(pi=np.ones((3, 1)), mu=np.ones((3, 1)), P=P, R=R, phi=np.eye(3), gamma=gamma,
                           start=np.array([1.0, 0, 0]))
    # Undiscounted within the episode: every state's value is the final reward 1.
    np.testing.assert_allclose(mdp_lib.v_pi(env), [1.0, 1.0, 1.0])
    np.savez(tmp_path / "ep.npz", **env._asdict())
    r = sweep.run(SweepSpec(env=str(tmp_path / "ep.npz"), algorithm="td", alpha=(0.2,), metrics=("rmsve",),
                            seeds=2, steps=600, log_every=100))
    assert r.mean[0, 0, 0] == pytest.approx(1.0, rel=1e-6)  # theta0 = 0: RMSVE = ||1||_d = 1
    assert r.mean[0, 0, -1] < 1e-3  # tabular TD(0) learns v = 1 exactly


# ------------------------------------------------------------------ user algorithms

def scaled_td_update(state, tr, eta, c=1.0):
    """TD(0) with step size eta * c (a user's algorithm, defined in this test)."""
    from bec_jax.algorithms import td
    return td.update(state, tr, eta * c)


USER_ALG = algorithms.Algorithm(
    name="user_scaled_td", init=algorithms.td.init, update=scaled_td_update,
    hyperparameters=(algorithms.step_size("eta", "step size"),
                     algorithms.parameter("c", "factor on eta", default=1.0, low=0.0, low_open=True)),
    equations="eq. (7) [td(0)theta], step size eta * c")


@pytest.fixture(scope="module")
def td_ref():
    """TD(0) at the step sizes the scaled user algorithms reach: 0.01, 0.02, 0.04."""
    return sweep.run(SweepSpec(env="two_state", algorithm="td", alpha=(0.01, 0.02, 0.04), **SMALL))


def test_user_algorithm_sweeps_from_python(td_ref):
    try:
        algorithms.register(USER_ALG)
        spec = SweepSpec(env="two_state", algorithm="user_scaled_td", eta=(0.01, 0.02), c=(1.0, 2.0), **SMALL)
        r = sweep.run(spec)
    finally:
        algorithms._REGISTRY.pop("user_scaled_td", None)
    td = td_ref
    # (eta, c) = (0.01, 2.0) is TD at alpha = 0.02 (0.01 * 2.0 == 0.02 exactly), but in
    # another program, which XLA may round differently on another CPU: equal to rounding.
    # (alpha = 0.01 or 0.04 would be off by far more.)
    i = int(np.flatnonzero((r.grid["eta"] == 0.01) & (r.grid["c"] == 2.0))[0])
    np.testing.assert_allclose(r.mean[:, i], td.mean[:, 1], rtol=1e-5, atol=1e-7)
    i = int(np.flatnonzero((r.grid["eta"] == 0.02) & (r.grid["c"] == 1.0))[0])
    np.testing.assert_allclose(r.mean[:, i], td.mean[:, 1], rtol=1e-5, atol=1e-7)
    # analysis gives its ODE matrix: -c A.
    G, _ = analysis.expected_update(envs.make("two_state"), USER_ALG, {"eta": 1.0, "c": 2.0})
    np.testing.assert_allclose(G, -2.0 * fixpoints.td_matrices(envs.make("two_state"))[0])


def test_user_algorithm_from_the_command_line(tmp_path, monkeypatch, capsys, td_ref):
    (tmp_path / "my_user_alg.py").write_text(textwrap.dedent("""
        from bec_jax.algorithms import Algorithm, step_size, parameter, td
        def update(state, tr, eta, c=1.0):
            return td.update(state, tr, eta * c)
        ALG = Algorithm(name="cli_scaled_td", init=td.init, update=update,
                        hyperparameters=(step_size("eta", "step size"),
                                         parameter("c", "factor", default=1.0, low=0.0, low_open=True)),
                        equations="eq. (7) [td(0)theta], scaled")
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["run", "--env", "two_state", "--algorithm", "my_user_alg:ALG", "--eta", "0.01,0.02",
                     "--c", "1,2", "--steps", "120", "--seeds", "6", "--log-every", "20", "--out", "out"])
    assert code == 0, capsys.readouterr().err
    r = SweepResult.load("out")
    assert r.spec.algorithm == "my_user_alg:ALG" and list(r.grid) == ["eta", "c"]
    # (eta, c) = (0.01, 1), (0.01, 2), (0.02, 1), (0.02, 2): TD at alpha = 0.01, 0.02, 0.02, 0.04 (doubling is
    # exact), in another program: equal to rounding.
    np.testing.assert_allclose(r.mean, td_ref.mean[:, [0, 1, 1, 2]], rtol=1e-5, atol=1e-7)
    # An option the algorithm does not declare is refused, naming it.
    code = cli.main(["run", "--env", "two_state", "--algorithm", "my_user_alg:ALG", "--eta", "0.01",
                     "--alpha", "0.1", "--out", "out2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bec-jax: error: alpha: unknown option --alpha; cli_scaled_td takes --eta, --c")


def test_static_hyperparameter_compiles_one_program_per_value(monkeypatch):
    from bec_jax.algorithms import Algorithm, ctdc, parameter, step_size

    def update(state, tr, alpha, beta, zeta, rho_on_omega=True):
        return ctdc.update(state, tr, alpha, beta, zeta, rho_on_omega=rho_on_omega)

    alg = Algorithm(name="ctdc_switch", init=ctdc.init, update=update,
                    hyperparameters=(step_size("alpha", "a"), step_size("beta", "b"), step_size("zeta", "z"),
                                     parameter("rho_on_omega", "rho on omega", default=True, static=True)),
                    equations="eqs. (32)-(34) [thetavmtdc, uvmtdc, omegavmtdc]")
    counter = CompileCounter(monkeypatch)
    try:
        algorithms.register(alg)
        r = sweep.run(SweepSpec(env="two_state", algorithm="ctdc_switch", alpha=(0.01,), beta=(0.1,),
                                zeta=(0.05,), rho_on_omega=(True, False), **SMALL))
    finally:
        algorithms._REGISTRY.pop("ctdc_switch", None)
    assert counter.count() == 2 and r.meta["num_programs"] == 2
    for flag, name in ((True, "ctdc"), (False, "ctdc_omega_no_rho")):
        ref = sweep.run(SweepSpec(env="two_state", algorithm=name, alpha=(0.01,), beta=(0.1,), zeta=(0.05,),
                                  **SMALL))
        np.testing.assert_array_equal(r.mean[:, r.grid["rho_on_omega"] == flag], ref.mean)


# ------------------------------------------------------------------ schedules: one mechanism

def test_robbins_monro_schedule_is_resolved_at_the_counter():
    """The sweep evaluates each step size's Robbins-Monro schedule at the update
    counter and hands the update the value; a loop calling the public update with
    the same schedules (resolved by the update itself) gives the same numbers."""
    from bec_jax.schedules import robbins_monro
    spec = SweepSpec(env="two_state", algorithm="ctd", alpha=(0.05,), beta=(0.2,), seeds=1, steps=60,
                     log_every=20, schedule={"kind": "robbins_monro", "t0": 10.0, "p_alpha": 0.9, "p_beta": 0.55})
    r = sweep.run(spec)
    env = envs.make("two_state")
    trs = streams.seed_transitions(spec, 0)
    st = algorithms.ctd.init(jnp.asarray(env.theta0, jnp.float32))
    a, b = robbins_monro(jnp.float32(0.05), 10.0, 0.9), robbins_monro(jnp.float32(0.2), 10.0, 0.55)
    upd = jax.jit(lambda st, tr: algorithms.ctd.update(st, tr, a, b))
    for t in range(spec.steps):
        st = upd(st, jax.tree.map(lambda x: x[t], trs))
    assert int(st.count) == 60
    np.testing.assert_allclose(r.final[0, 0, 0], metrics.rmscbe(env, st.theta), rtol=1e-5)
    with pytest.raises(ValueError, match="schedule.p_zeta: ctd has no step size zeta"):
        SweepSpec(env="two_state", algorithm="ctd", alpha=0.1, beta=0.1,
                  schedule={"kind": "robbins_monro", "p_zeta": 0.7})
    with pytest.raises(ValueError, match="schedule.p_alpha: used only by the robbins_monro schedule"):
        SweepSpec(env="two_state", algorithm="ctd", alpha=0.1, beta=0.1, schedule={"p_alpha": 0.7})


# ------------------------------------------------------------------ the CLI lambda/gamma sweep

def test_cli_lambda_and_gamma_sweep(tmp_path, capsys):
    out = tmp_path / "lg"
    code = cli.main(["run", "--env", "two_state", "--algorithm", "ctd_lambda", "--alpha", "0.01",
                     "--beta", "0.1", "--lambda", "0,0.9", "--env-param", "gamma=0.8,0.9", "--env-param", "a=0.3",
                     "--steps", "100", "--seeds", "4", "--log-every", "20", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    recs = json.load(open(out / "summary.json"))
    assert [(r["gamma"], r["a"], r["lambda"]) for r in recs] == [(0.8, 0.3, 0.0), (0.8, 0.3, 0.9),
                                                                  (0.9, 0.3, 0.0), (0.9, 0.3, 0.9)]
    spec = SweepResult.load(str(out)).spec
    assert spec.env_params == (("gamma", (0.8, 0.9)), ("a", (0.3,)))
    # The same run from TOML.
    cfg = tmp_path / "lg.toml"
    cfg.write_text('env = "two_state"\nalgorithm = "ctd_lambda"\nalpha = [0.01]\nbeta = [0.1]\n'
                   'lambda = [0, 0.9]\nsteps = 100\nseeds = 4\nlog_every = 20\n'
                   '[env_params]\ngamma = [0.8, 0.9]\na = 0.3\n')
    code = cli.main(["run", "--config", str(cfg), "--out", str(tmp_path / "lg2")])
    assert code == 0, capsys.readouterr().err
    a, b = SweepResult.load(str(out)), SweepResult.load(str(tmp_path / "lg2"))
    assert a.spec == b.spec
    np.testing.assert_array_equal(a.mean, b.mean)


def test_explicit_points_mix_hyperparameters_and_env_parameters(gamma_alone):
    """Three points, not a product grid, on the gamma fixture's model and algorithm:
    each equals the same point of a one-model run at its gamma, bit for bit."""
    pts = [{"alpha": 0.05, "beta": 0.1, "zeta": 0.05, "gamma": 0.5},
           {"alpha": 0.2, "beta": 0.1, "zeta": 0.05, "gamma": 0.95},
           {"alpha": 0.05, "beta": 0.1, "zeta": 0.05, "gamma": 0.95}]
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", points=pts, metrics=("rmscbe", "rmsve"), **SMALL)
    assert spec.grid_names == ("gamma", "alpha", "beta", "zeta") and spec.num_points == 3
    r = sweep.run(spec)
    for i, p in enumerate(pts):
        alone = gamma_alone[p["gamma"]]
        j = int(np.flatnonzero(alone.grid["alpha"] == p["alpha"])[0])
        np.testing.assert_array_equal(r.mean[:, i], alone.mean[:, j])
        assert r.point(i) == p
