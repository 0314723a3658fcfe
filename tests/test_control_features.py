"""Feature kinds of control (bec_jax.control.transition, bec_jax.control.features)
against dense NumPy steps: sparse binary indices and dense vectors give the
updates of Q, CQ, GQ and CGQ written as the dense linear formulas."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control import algorithms as ca
from bec_jax.control import transition
from bec_jax.control.transition import ControlTransition
from bec_jax.engine import tuning

D, A = 9, 3
H = {"alpha": 0.3, "beta": 0.2, "zeta": 0.25}
NAMES = ["q", "cq", "gq", "cgq", "gq_authors", "cgq_authors", "rcq_simple", "rcq_value"]
AUX = {"q": (), "cq": ("omega",), "gq": ("u",), "cgq": ("u", "omega"), "gq_authors": ("u",),
       "cgq_authors": ("u", "omega"), "rcq_simple": ("rbar",), "rcq_value": ("rbar",)}


# ------------------------------------------------------------------ the dense NumPy step

def np_step(name, x, phi, phin, r, disc, gamma, h):
    """One step of `name` in float64 from dense phi(s, a) (d,) and phi(s', .) (A, d),
    as the papers write them (no index anywhere)."""
    w = x["w"]
    q_next = phin @ w
    a_star = int(np.argmax(q_next))
    delta = r + disc * q_next[a_star] - w @ phi
    out = {}
    al, be, ze = h["alpha"], h["beta"], h["zeta"]
    if name == "q":
        out["w"] = w + al * delta * phi
    elif name == "cq":
        err = delta - x["omega"]
        out["w"], out["omega"] = w + al * err * phi, x["omega"] + be * err
    elif name in ("gq", "gq_authors", "cgq", "cgq_authors"):
        g = gamma if name.endswith("_authors") else disc
        err = delta - x["omega"] if name.startswith("c") else delta
        p = x["u"] @ phi
        out["w"] = w + al * (err * phi - g * p * phin[a_star])
        out["u"] = x["u"] + ze * (err - p) * phi
        if name.startswith("c"):
            out["omega"] = x["omega"] + be * err
    else:
        dbar = delta - x["rbar"]
        out["w"] = w + al * dbar * phi
        out["rbar"] = x["rbar"] + be * ((r - x["rbar"]) if name == "rcq_simple" else dbar)
    return out


def one_hot_sum(idx, d=D):
    phi = np.zeros(d)
    np.add.at(phi, np.asarray(idx), 1.0)
    return phi


def light() -> dict | None:
    """The engine's light XLA:CPU options (`tuning.CPU_LIGHT_OPTIONS`, about half
    the compile) where JAX runs on the CPU; none elsewhere. The programs here are
    about what they compute, not how they are compiled."""
    return tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None


@functools.cache
def jitted(name):
    alg = ca.get(name)
    return jax.jit(lambda s, tr, h: alg.apply(s, tr, h), compiler_options=light())


def make_state(name, x):
    st = ca.get(name).init(jnp.asarray(x["w"], jnp.float32))
    return st._replace(**{f: jnp.asarray(x[f], jnp.float32) for f in st._fields if f != "count"})


def random_state(rng):
    return {"w": rng.normal(size=D) * 0.5, "u": rng.normal(size=D) * 0.5, "omega": float(rng.normal()),
            "rbar": float(rng.normal())}


def run_sequence(name, kind, n=30, seed=0):
    """n random transitions through the jitted update and the NumPy step; returns
    (jax state, numpy state)."""
    rng = np.random.default_rng(seed)
    x = random_state(rng)
    st = make_state(name, x)
    for i in range(n):
        r, disc = float(rng.normal()), (0.0 if i % 7 == 3 else 0.9)
        if kind == "sparse":  # 2 active indices per (s, a), overlaps and repeats allowed
            idx, nidx = rng.integers(0, D, 2), rng.integers(0, D, (A, 2))
            phi, phin = one_hot_sum(idx), np.stack([one_hot_sum(row) for row in nidx])
            f, fn = jnp.asarray(idx, jnp.int32), jnp.asarray(nidx, jnp.int32)
        else:
            phi, phin = rng.normal(size=D), rng.normal(size=(A, D))
            f, fn = jnp.asarray(phi, jnp.float32), jnp.asarray(phin, jnp.float32)
            phi, phin = np.asarray(f, np.float64), np.asarray(fn, np.float64)
        tr = ControlTransition(active=f, reward=jnp.float32(r), discount=jnp.float32(disc),
                               gamma=jnp.float32(0.9), next_active=fn)
        st = jitted(name)(st, tr, H)
        x = {**x, **np_step(name, x, phi, phin, np.float32(r), np.float32(disc), np.float32(0.9), H)}
    return st, x


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("name", NAMES)
def test_updates_match_the_dense_numpy_step(name, kind):
    st, x = run_sequence(name, kind, seed=NAMES.index(name))
    # float32 updates against float64 NumPy over 30 steps: rounding only.
    for f in ("w",) + AUX[name]:
        np.testing.assert_allclose(np.asarray(getattr(st, f)), x[f], rtol=2e-4, atol=2e-5, err_msg=f)
    assert not np.allclose(np.asarray(st.w), random_state(np.random.default_rng(NAMES.index(name)))["w"],
                           atol=1e-2)


def test_dense_one_hot_equals_sparse_indices():
    """Dense one-hot vectors and their indices are the same features: the same
    GQ step, up to the order of float32 additions."""
    rng = np.random.default_rng(5)
    x = random_state(rng)
    idx, nidx = np.array([1, 4]), np.array([[2, 4], [0, 8], [3, 3]])
    kw = dict(reward=jnp.float32(0.5), discount=jnp.float32(0.9), gamma=jnp.float32(0.9))
    sparse = ControlTransition(active=jnp.asarray(idx, jnp.int32), next_active=jnp.asarray(nidx, jnp.int32), **kw)
    dense = ControlTransition(active=jnp.asarray(one_hot_sum(idx), jnp.float32),
                              next_active=jnp.asarray(np.stack([one_hot_sum(r) for r in nidx]), jnp.float32), **kw)
    for name in ("gq", "cgq"):
        a, b = jitted(name)(make_state(name, x), sparse, H), jitted(name)(make_state(name, x), dense, H)
        for f in ("w", "u"):
            np.testing.assert_allclose(np.asarray(a._asdict()[f]), np.asarray(b._asdict()[f]), rtol=1e-6, atol=1e-6)


def test_q_values_and_add_by_hand():
    w = jnp.asarray([1.0, 2.0, 4.0, 8.0], jnp.float32)
    q_values, add = jax.jit(transition.q_values), jax.jit(transition.add)  # a program a call, not an operation
    np.testing.assert_array_equal(q_values(w, jnp.asarray([[0, 2], [3, 3]], jnp.int32)), [5.0, 16.0])
    np.testing.assert_array_equal(q_values(w, jnp.asarray([0.5, 0.0, 0.25, 1.0], jnp.float32)), 9.5)
    np.testing.assert_array_equal(add(w, jnp.asarray([1, 1], jnp.int32), 0.5), [1.0, 3.0, 4.0, 8.0])
    np.testing.assert_array_equal(add(w, jnp.asarray([2.0, 0.0, 0.0, -1.0], jnp.float32), 0.5),
                                  [2.0, 2.0, 4.0, 7.5])
    # dense features of another float dtype are used in w's dtype (the scan's carry keeps its type)
    assert jax.eval_shape(transition.add, w, jnp.ones(4, jnp.float16), 1.0).dtype == jnp.float32
    assert transition.is_sparse(jnp.zeros(2, jnp.int32)) and not transition.is_sparse(jnp.zeros(2))


def test_shape_checks_of_dense_features():
    st = ca.q_init(jnp.zeros(D))
    tr = ControlTransition(active=jnp.zeros(D), reward=jnp.float32(0), discount=jnp.float32(0.9),
                           gamma=jnp.float32(0.9), next_active=jnp.zeros((A, D)))
    ca.q_update(st, tr, alpha=0.1)
    with pytest.raises(AssertionError):  # a dense vector must have the weights' length
        ca.q_update(st, tr._replace(active=jnp.zeros(D - 1), next_active=jnp.zeros((A, D - 1))), alpha=0.1)
    with pytest.raises(AssertionError):  # one kind for (s, a) and (s', .)
        ca.q_update(st, tr._replace(next_active=jnp.zeros((A, D), jnp.int32)), alpha=0.1)


# ------------------------------------------------------------------ feature maps by hand

from bec_jax.control import features as fmaps  # noqa: E402


def test_tile_coding_of_a_box_by_hand():
    # One tiling of 2 x 2 tiles on [0, 1] x [-1, 1]: tile = 2 c0 + c1; action b's at b * 4.
    fm = fmaps.make("tiles", [0.0, -1.0], [1.0, 1.0], 3, num_tilings=1, bins=2)
    assert fm.num_features == 12 and fm.params == {"num_tilings": 1, "bins": [2, 2]}
    fn = jax.jit(fm.fn)  # one program for both points (op by op, each operation would be compiled alone)
    got = np.asarray(fn(jnp.asarray([0.7, -0.2])))
    np.testing.assert_array_equal(got, [[2], [6], [10]])
    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray([-5.0, 9.0]))), [[1], [5], [9]])  # outside: outer tiles
    # Two tilings of 4 bins in 1-D, shifted by 0 and +1/8 (tiles.tiling_offsets: k = 0, 1 times a
    # tile width over 2): edges 0.25, 0.5, 0.75 and 0.375, 0.625, 0.875; a tiling has 4 tiles.
    fn = jax.jit(fmaps.make("tiles", [0.0], [1.0], 2, num_tilings=2, bins=4).fn)
    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray([0.3]))), [[1, 4], [9, 12]])
    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray([0.4]))), [[1, 5], [9, 13]])


def test_fourier_basis_by_hand():
    fm = fmaps.make("fourier", [-2.0], [2.0], 2, order=2)
    assert fm.num_features == 6
    fn = jax.jit(fm.fn)  # one program for the three points (op by op, each operation would be compiled alone)
    # u = (x - low) / (high - low); features cos(pi c u), c = 0, 1, 2, in action b's block.
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray([0.0]))), [[1, 0, -1, 0, 0, 0], [0, 0, 0, 1, 0, -1]],
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray([-1.0])))[0, :3], [1, np.cos(np.pi / 4), 0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray([7.0])))[0, :3], [1, -1, 1], atol=1e-6)  # clipped
    # In 2-D the coefficients are every (c0, c1) in {0, 1}^2, c1 varying fastest.
    fm = fmaps.make("fourier", [0.0, 0.0], [1.0, 1.0], 1, order=1)
    fn = jax.jit(fm.fn)
    np.testing.assert_allclose(np.asarray(fn(jnp.asarray([0.5, 1.0])))[0], [1, -1, 0, 0], atol=1e-6)
    # one example at a time, batched by the caller: vmap equals the loop
    xs = jnp.asarray(np.random.default_rng(0).uniform(-0.5, 1.5, (5, 2)), jnp.float32)
    # (another program: XLA may vectorise cos differently, so to float32 rounding)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(fm.fn))(xs)), np.stack([fn(x) for x in xs]),
                               rtol=0, atol=1e-6)


def test_rbf_basis_by_hand():
    fm = fmaps.make("rbf", [0.0], [4.0], 2, centers=3, sigma=0.5)
    assert fm.num_features == 6 and fm.params == {"centers": 3, "sigma": 0.5}
    # centers 0, 0.5, 1 of the scaled box; x = 0 -> u = 0: exp(-d^2 / (2 * 0.25)).
    np.testing.assert_allclose(np.asarray(fm.fn(jnp.asarray([0.0])))[1], [0, 0, 0, 1, np.exp(-0.5), np.exp(-2.0)],
                               rtol=1e-6)
    assert fmaps.make("rbf", [0.0], [1.0], 1, centers=5).params["sigma"] == 0.25  # one grid spacing


def test_a_feature_map_of_ones_own(tmp_path, monkeypatch):
    (tmp_path / "my_features_test.py").write_text(
        "import jax.numpy as jnp\n"
        "from bec_jax.control.features import FeatureMap, per_action\n"
        "def poly(low, high, num_actions, *, degree=2):\n"
        "    fn = per_action(lambda x: jnp.concatenate([x ** p for p in range(degree + 1)]), "
        "len(low) * (degree + 1), num_actions)\n"
        "    return FeatureMap(num_actions * len(low) * (degree + 1), fn, {'degree': degree})\n"
        "def sa(low, high, num_actions):\n"  # per-state-action features (A, k), one weight vector for all
        "    return FeatureMap(2, lambda x: jnp.stack([jnp.stack([x[0], jnp.float32(b)]) "
        "for b in range(num_actions)]), {})\n"
        "def wrong(low, high, num_actions):\n"
        "    return FeatureMap(3, lambda x: jnp.zeros((num_actions, 2)), {})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fm = fmaps.make("my_features_test:poly", [-1.0], [1.0], 2, degree=2)
    np.testing.assert_allclose(np.asarray(fm.fn(jnp.asarray([3.0]))), [[1, 3, 9, 0, 0, 0], [0, 0, 0, 1, 3, 9]])
    fm = fmaps.make("my_features_test:sa", [-1.0], [1.0], 3)
    np.testing.assert_array_equal(np.asarray(fm.fn(jnp.asarray([0.5]))), [[0.5, 0], [0.5, 1], [0.5, 2]])
    assert fmaps.check(fm, 1, 3) == (2, False)
    with pytest.raises(ValueError, match="^features: 'my_features_test:wrong' gives dense rows of 2, but"):
        fmaps.make("my_features_test:wrong", [-1.0], [1.0], 2)
    with pytest.raises(ValueError, match="^degre: not a parameter of features 'my_features_test:poly'"):
        fmaps.make("my_features_test:poly", [-1.0], [1.0], 2, degre=2)
    with pytest.raises(ValueError, match="^features: cannot import 'nope_features_test'"):
        fmaps.make("nope_features_test:f", [-1.0], [1.0], 2)


# ------------------------------------------------------------------ dense features in the loop

def np_fourier(obs, low, high, order, num_actions):
    """(A, A k) from NumPy: the Fourier basis (Konidaris et al. 2011) in action b's block."""
    u = np.clip((np.asarray(obs, np.float64) - low) / (high - low), 0, 1)
    import itertools
    c = np.asarray(list(itertools.product(range(order + 1), repeat=len(low))), np.float64)
    x = np.cos(np.pi * c @ u)
    return np.kron(np.eye(num_actions), x)


# CGQ only: CQ is its case at zeta 0, bit for bit (tests/test_control_fusion.py), and
# its dense update is checked above (test_updates_match_the_dense_numpy_step[cq-dense]).
@pytest.mark.parametrize("name", ["cgq"])
def test_gymnax_fourier_loop_steps_match_numpy(name):
    """40 loop steps of CartPole-v1 with Fourier features: at every step the
    transition's features are NumPy's Fourier basis of the observations and the
    learner's new state is the dense NumPy step from its old one."""
    pytest.importorskip("gymnax")
    from bec_jax.control import loop, tasks
    low, high = np.array([-2.4, -3.0, -0.25, -3.5]), np.array([2.4, 3.0, 0.25, 3.5])
    env = tasks.make("gymnax:CartPole-v1", features="fourier", order=1, low=" ".join(map(str, low)),
                     high=" ".join(map(str, high)))
    alg = ca.get(name)
    h = {"alpha": 0.05, "beta": 0.1, "zeta": 0.1}

    @functools.partial(jax.jit, compiler_options=light())
    def step(learner, ls, log, key):
        rec = lambda st, tr: (alg.apply(st[0], tr, h), tr)
        (new, tr), ls2, log, done = loop.advance(env, rec, lambda st: st[0].w, loop.Behaviour(0.2), 500, 0.99,
                                                 learner, ls, log, key)
        return (new, tr), ls2, loop.reset_done(env, ls2, done, key), log

    dummy = ControlTransition(jnp.zeros(32), jnp.float32(0), jnp.float32(0), jnp.float32(0), jnp.zeros((2, 32)))
    learner = (alg.init(jnp.zeros(32)), dummy)
    ls, log = jax.jit(lambda key: loop.loop_init(env, key))(jax.random.key(1)), loop.log_init(4)  # one program
    for t in range(40):
        before = {f: np.asarray(v, np.float64) for f, v in learner[0]._asdict().items() if f != "count"}
        obs = np.asarray(ls.env.obs)
        learner, after, ls, log = step(learner, ls, log, jax.random.fold_in(jax.random.key(2), t))
        tr = learner[1]
        phis, phin = np_fourier(obs, low, high, 1, 2), np_fourier(np.asarray(after.env.obs), low, high, 1, 2)
        a = [b for b in range(2) if np.allclose(np.asarray(tr.active), phis[b], atol=1e-5)]
        assert len(a) == 1, t  # the taken action's row, and no other
        np.testing.assert_allclose(np.asarray(tr.next_active), phin, atol=1e-5)
        want = np_step(name, before, phis[a[0]], phin, float(tr.reward), float(tr.discount), 0.99, h)
        for f, v in want.items():
            np.testing.assert_allclose(np.asarray(learner[0]._asdict()[f]), v, rtol=1e-4, atol=1e-5, err_msg=f"{f} {t}")
    assert np.abs(np.asarray(learner[0].w)).max() > 0.01 and int(ls.episodes) >= 1


# ------------------------------------------------------------------ the README's quickstart

@pytest.mark.long
def test_readme_control_quickstart_runs_as_pasted(tmp_path):
    """The README's second quickstart (the same block as docs/control.md's "Your
    task, your features"), run by bash
    where the repository root would be (the gridworld example copied there):
    both runs finish every episode, and most of the gridworld's last episodes
    take the 6-step shortest path of its 4x4 grid."""
    import os
    import shutil
    import subprocess
    import sys
    pytest.importorskip("gymnax")
    from bec_jax.control.results import ControlResult
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from docs_blocks import code
    block = code("README.md", "bash", section="Quickstart 2: centered Q-learning on your own task",
                 containing="bec-jax control")
    assert block == code("docs/control.md", "bash", section="Your task, your features")
    assert "gymnax:CartPole-v1" in block and "examples.gridworld:make_gridworld" in block
    (tmp_path / "examples").mkdir()
    shutil.copy(os.path.join(repo, "examples", "gridworld.py"), tmp_path / "examples" / "gridworld.py")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    p = subprocess.run(["bash", "-ec", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    cart = ControlResult.load(str(tmp_path / "runs" / "cartpole"))
    assert cart.lengths.shape == (1, 2, 20) and cart.valid.all() and np.all(cart.lengths >= 8)
    grid = ControlResult.load(str(tmp_path / "runs" / "grid"))
    # epsilon 0.1 explores now and then: most last episodes, not all, take the shortest path
    assert grid.lengths.shape == (2, 2, 30) and grid.lengths.min() == 6 and np.median(grid.lengths[0, :, -10:]) == 6
    assert grid.lengths[1, :, -10:].mean() > grid.lengths[0, :, -10:].mean()  # slip 0.2 strays from the path
    assert grid.meta["task_axes"] == "one program (traced)" and grid.meta["compiled_programs"] == 1
    assert "best by mean return per episode at slip=0.2:" in p.stdout  # the best setting at each task value


# ------------------------------------------------------------------ bad input on the command line

BOX = ["--task-param", "low=-1", "--task-param", "high=1"]


@pytest.mark.parametrize("args,field", [
    (["--task", "gymnax:Nope"], "task: unknown gymnax environment 'Nope'"),
    (["--task", "gymnax:Pendulum-v1"], "task: gymnax:Pendulum-v1 has a continuous action space"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "features=nope"] + BOX, "features: unknown feature map"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "features=nope_mod_test:f"] + BOX, "features: cannot import"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "features=fourier"], "low: the observation space is unbounded"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "features=fourier", "--task-param", "order=-1"] + BOX,
     "order: an integer >= 0"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "features=fourier", "--task-param", "bins=3"] + BOX,
     "bins: not a parameter of features 'fourier'"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "low=1 2"], "low: a number or 4 numbers"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "gravity=heavy"] + BOX,
     "gravity: a number (a parameter of gymnax:CartPole-v1's dynamics)"),
    (["--task", "gymnax:CartPole-v1", "--task-param", "max_steps_in_episode=9"] + BOX,
     "max_steps_in_episode: the time limit is the loop's episode cap"),
    (["--task", "gymnax:Breakout-MinAtar"], "bins: 3 actions x about 1e362 tiles"),  # 400 dimensions
    (["--task", "examples.gridworld:nope"], "task: module 'examples.gridworld' has no attribute 'nope'"),
    (["--task", "examples.gridworld:make_gridworld", "--task-param", "size=1"], "size: an integer >= 2, got 1"),
    (["--task", "examples.gridworld:make_gridworld", "--task-param", "wide=3"],
     "wide: not a parameter of examples.gridworld:make_gridworld"),
])
def test_a_bad_task_or_feature_map_exits_2_with_one_line(args, field, tmp_path, capsys, monkeypatch):
    import os

    from bec_jax.cli.commands import main
    pytest.importorskip("gymnax")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where examples/ is
    out = tmp_path / "x"
    argv = ["control", *args, "--algorithm", "q", "--alpha", "0.1", "--episodes", "2", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bec-jax: error: {field}"), err
    assert not out.exists()


def test_a_gymnax_environment_parameter_is_a_grid_axis_of_one_program():
    """CartPole's gravity, a field of its EnvParams, as a task axis: both values
    in one program, each point what the task with that gravity alone gives
    (gravity enters the same float32 arithmetic either way: the same bits)."""
    pytest.importorskip("gymnax")
    from bec_jax.control import sweep, tasks
    from bec_jax.control.spec import ControlSpec
    kw = dict(task="gymnax:CartPole-v1", algorithm="cq", hyperparameters={"alpha": [0.01], "beta": [0.01]}, seeds=2,
              episodes=8, task_params={"features": "fourier", "order": 1, "low": -3, "high": 3}, epsilon=0.1)
    spec = ControlSpec(task_axes={"gravity": [9.8, 30.0]}, **kw)
    assert spec.task_axes_traced
    r = sweep.run(spec, progress=False)
    assert r.meta["compiled_programs"] == 1
    for i, g in enumerate((9.8, 30.0)):
        alone = sweep.run(ControlSpec(**{**kw, "task_params": {**kw["task_params"], "gravity": g}}), progress=False)
        np.testing.assert_array_equal(r.lengths[i], alone.lengths[0])
        np.testing.assert_array_equal(r.returns[i], alone.returns[0])
    assert not np.array_equal(r.lengths[0], r.lengths[1])
    assert tasks.make("gymnax:CartPole-v1", features="fourier", order=1, low=-3, high=3,
                      gravity=30.0).params["gravity"] == 30.0


# ------------------------------------------------------------------ one sweep, either kind

def test_dense_one_hot_sweep_equals_the_sparse_sweep():
    """CliffWalking's one-hot features given as dense vectors (A, 192) run the
    same CGQ sweep as its sparse indices, bit for bit: the products are by 0
    and 1 and the sums add exact zeros, so Q values and updates are the same
    floats in another program."""
    import dataclasses

    from bec_jax.control import sweep, tasks
    from bec_jax.control.spec import ControlSpec

    def dense_cliff(**params):
        env = tasks.cliff_walking(**params)
        eye = jnp.eye(env.num_features, dtype=jnp.float32)
        return dataclasses.replace(env, name="dense_cliff_test", num_active=env.num_features,
                                   features=lambda s: eye[env.features(s)].sum(axis=1))

    kw = dict(algorithm="cgq", hyperparameters={"alpha": [0.1, 0.3], "beta": 1e-3, "zeta": 0.01}, seeds=3,
              episodes=15, epsilon=0.1)
    tasks.register("dense_cliff_test", dense_cliff)
    try:
        assert jax.eval_shape(tasks.make("dense_cliff_test").features, jnp.int32(36)).shape == (4, 192)
        dense = sweep.run(ControlSpec(task="dense_cliff_test", **kw), progress=False)
    finally:
        tasks.TASKS.pop("dense_cliff_test", None)
    sparse = sweep.run(ControlSpec(task="cliff_walking", **kw), progress=False)
    np.testing.assert_array_equal(dense.lengths, sparse.lengths)
    np.testing.assert_array_equal(dense.returns, sparse.returns)
    np.testing.assert_array_equal(dense.omega, sparse.omega)
    assert dense.lengths.sum() > 3000  # the runs did learn something to compare
