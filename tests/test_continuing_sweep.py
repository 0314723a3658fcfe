"""The continuing control front: spec checks, the one compiled program against
a NumPy replay of the same runs, learning on TwoChoice against the exact
epsilon-greedy gain, the result's statistics against scipy, save/load and the
run directory through the table of kinds.

Two sweeps are compiled for the whole module (module-scoped fixtures), each
about 1.5 s to compile."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from bec_jax.control.continuing import exact, program, sweep
from bec_jax.control.continuing.results import ContinuingResult
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.run import kinds
from bec_jax.run.runner import run_to_dir

EPS = 0.1


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """TwoChoice, value-based centering and differential Q at gamma 1, 20
    seeds x 5000 steps, run into a directory by the runner and loaded back."""
    out = {}
    for alg in ("q_vrc", "diff_q"):
        spec = ContinuingSpec(task="two_choice", algorithm=alg, hyperparameters={"alpha": 0.2, "eta": [0.1, 1.0]},
                              epsilon=EPS, gamma=1.0, seeds=20, steps=5000, log_every=50)
        d = str(tmp_path_factory.mktemp(alg))
        ran = run_to_dir(spec, d)
        out[alg] = (spec, d, ran)
    return out


# epsilon = 1: the behaviour is uniform at random, so a run's actions and rewards
# are its random draws' alone and a replay gives them bit for bit; the learner's
# float32 arithmetic may round differently from XLA's in the last bit (XLA:CPU
# may contract a multiply and an add into one FMA), so its values are compared
# to a tolerance. (With epsilon < 1 such a bit can flip a near tie of two action
# values, and the runs part.)
REPLAY = dict(task="river_swim", algorithm="q_vrc", hyperparameters={"alpha": [0.1, 0.3], "eta": 0.5},
              gamma=0.95, reward_offset=[0.0, 3.0], q0=0.5, epsilon=1.0, seeds=3, seed=7, seed_offset=5,
              steps=2000, log_every=50)


@pytest.fixture(scope="module")
def replayed():
    spec = ContinuingSpec(**REPLAY)
    return spec, sweep.run(spec)


def eps_greedy_gain(P, R, opt: exact.Optimal, eps: float) -> float:
    """The exact gain of epsilon-greedy on the optimal policy."""
    S, A = R.shape
    pi = np.full((S, A), eps / A)
    pi[np.arange(S), opt.policy] += 1 - eps
    return exact.policy_gain(P, R, pi)


@pytest.mark.parametrize("alg", ["q_vrc", "diff_q"])
def test_two_choice_learns_the_better_loop(learned, alg):
    spec, _, r = learned[alg]
    P, R = spec.make_task().model()
    opt = exact.optimal(P, R)
    assert opt.gain == pytest.approx(0.4)
    target = eps_greedy_gain(P, R, opt, EPS)  # (0.95 * 2 + 0.05 * 1) / 5 = 0.39
    assert target == pytest.approx(0.39)
    mean, lo, hi = r.rate_interval("last10")
    assert np.all((lo <= target) & (target <= hi)), (mean, lo, hi)
    assert np.all(np.abs(mean - target) < 0.005)
    assert np.all(r.greedy_optimal_fraction() == 1.0)
    assert r.optimal_gain == pytest.approx(0.4)
    rec = r.summary()[0]
    assert rec["gap_last10"] == pytest.approx(0.4 - mean[0])
    # the reward-rate estimate converges near the behaviour's gain
    assert np.all(np.abs(r.rate_estimate[..., -1].mean(-1) - target) < 0.05)


def test_value_based_centering_at_gamma_1_is_differential_q(learned):
    a, b = learned["q_vrc"][2], learned["diff_q"][2]
    np.testing.assert_array_equal(a.reward, b.reward)
    np.testing.assert_array_equal(a.q_table, b.q_table)


def test_run_directory_and_kind(learned):
    spec, d, r = learned["q_vrc"]
    for f in ("curves.npz", "summary.json", "summary.csv", "meta.json"):
        assert os.path.isfile(os.path.join(d, f))
    assert kinds.of_dir(d).name == "continuing"
    loaded = kinds.load_result(d)
    assert isinstance(loaded, ContinuingResult) and loaded.spec == spec
    with open(os.path.join(d, "meta.json")) as f:
        assert json.load(f)["spec"]["kind"] == "continuing"


def test_rates_and_intervals_against_scipy(learned):
    _, d, r = learned["q_vrc"]
    with np.load(os.path.join(d, "curves.npz")) as z:
        reward = z["reward"].astype(np.float64)
    L = reward.shape[-1]
    for window, k in (("all", L), ("last50", L // 2), ("last10", L // 10)):
        per_seed = reward[..., -k:].mean(-1)
        np.testing.assert_allclose(r.reward_rate(window), per_seed, rtol=1e-12)
        mean, lo, hi = r.rate_interval(window)
        for i in range(r.num_points):
            v = per_seed[i]
            want = scipy.stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=scipy.stats.sem(v))
            assert mean[i] == pytest.approx(v.mean(), rel=1e-12)
            assert (lo[i], hi[i]) == pytest.approx(want, rel=1e-9)
    x, m, lo, hi = r.curve(0)
    assert x[-1] == 5000 and len(x) == L
    np.testing.assert_allclose(m, reward[0].mean(0), rtol=1e-12)
    assert r.best_index("all") in range(r.num_points)


def test_save_load_round_trip(replayed, tmp_path):
    spec, r = replayed
    r.save(str(tmp_path))
    back = ContinuingResult.load(str(tmp_path))
    assert back.spec == spec and back.spec_dict == r.spec_dict
    for name in ("reward", "rate_estimate", "max_abs_w", "q_table"):
        np.testing.assert_array_equal(getattr(back, name), getattr(r, name))
    assert list(back.grid) == list(r.grid) == list(spec.names)
    assert back.summary() == r.summary()
    assert ContinuingSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def replay(spec: ContinuingSpec, point: dict, i: int) -> dict:
    """Seed i of grid point `point`, replayed step by step in NumPy float32:
    the same keys (seed i's key fold_in(key(seed), seed_offset + i), split
    into initial-state and stream keys; step t's key fold_in(stream, t), its
    action uniforms its words' top 24 bits, the task's key fold_in(step key,
    1)), the task's own step function tabulated over every (state, action)
    at each step, and value-based centering written out."""
    task = spec.make_task()
    S, A, T, K = task.num_states, task.num_actions, spec.steps, spec.block_steps
    key = jax.random.fold_in(jax.random.key(spec.seed), spec.seed_offset + i)
    init_key, stream = jax.random.split(key)
    step_keys = jax.vmap(lambda t: jax.random.fold_in(stream, t))(jnp.arange(T, dtype=jnp.uint32))
    u = (np.asarray(jax.random.key_data(step_keys)) >> 8).astype(np.float32) * np.float32(2.0 ** -24)
    task_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(step_keys)
    every = jax.vmap(lambda s, a: jax.vmap(lambda k: task.step(k, s, a))(task_keys))
    s_all, a_all = np.repeat(np.arange(S), A), np.tile(np.arange(A), S)
    nxt, rew = (np.asarray(x).reshape(S, A, T) for x in every(jnp.asarray(s_all), jnp.asarray(a_all)))
    f32 = np.float32
    alpha, eta, g, eps = f32(point["alpha"]), f32(point["eta"]), f32(point["gamma"]), f32(point["epsilon"])
    offset = f32(point["reward_offset"])
    w = np.full(S * A, f32(point["q0"]), f32)
    rbar = f32(0)
    s = int(task.reset(init_key))
    rewards = np.zeros(T, f32)
    for t in range(T):
        q = w[np.arange(A) * S + s]
        if u[t, 0] < eps:
            a = min(int(u[t, 1] * f32(A)), A - 1)
        else:
            ties = np.flatnonzero(q == q.max())
            a = ties[min(int(u[t, 1] * f32(len(ties))), len(ties) - 1)]
        s2, r = int(nxt[s, a, t]), f32(rew[s, a, t])
        rewards[t] = r
        q2 = w[np.arange(A) * S + s2]
        delta = (r + offset) + g * q2[np.argmax(q2)] - w[a * S + s]
        err = f32(delta - rbar)
        w[a * S + s] = w[a * S + s] + alpha * err
        rbar = f32(rbar + (eta * alpha) * err)
        s = s2
    blocks = np.zeros(T // K, f32)
    for j in range(T // K):  # summed in order, as the program's scan does (np.sum pairs them)
        total = f32(0)
        for r in rewards[j * K:(j + 1) * K]:
            total = f32(total + r)
        blocks[j] = total / f32(K)
    return {"reward": blocks, "rbar": rbar, "q_table": w.reshape(A, S).T}


def test_program_equals_a_numpy_replay(replayed):
    spec, r = replayed
    for p, point in enumerate(spec.grid_points()):
        for i in range(spec.seeds):
            want = replay(spec, point, i)
            np.testing.assert_array_equal(r.reward[p, i], want["reward"])
            np.testing.assert_allclose(r.q_table[p, i], want["q_table"], rtol=1e-4, atol=1e-5)
            assert r.rate_estimate[p, i, -1] == pytest.approx(want["rbar"], rel=1e-4, abs=1e-5)


def test_reward_offset_reaches_the_learner_not_the_report(replayed):
    spec, r = replayed
    at = {off: r.select(reward_offset=off) for off in (0.0, 3.0)}
    # the reported rewards are the task's own: the same draws, the same rewards
    np.testing.assert_array_equal(r.reward[at[0.0]], r.reward[at[3.0]])
    assert r.reward.max() <= 1  # (RiverSwim's rewards are 5e-4 and 1)
    # while the learner saw r + 3: its reward-rate estimate moved by about 3
    moved = r.rate_estimate[at[3.0]][..., -1] - r.rate_estimate[at[0.0]][..., -1]
    assert np.all(np.abs(moved - 3.0) < 0.5), moved
    rates = r.reward_rate("all")
    np.testing.assert_array_equal(rates[at[0.0]], rates[at[3.0]])


def test_a_seed_does_not_depend_on_the_seed_count_or_chunking(replayed):
    spec, r = replayed
    small = spec.replace(seeds=1, seed_offset=spec.seed_offset + 2, reward_offset=3.0, hyperparameters={
        "alpha": 0.3, "eta": 0.5})
    got = sweep.run(small, chunk_size=1)
    p = int(np.flatnonzero(r.select(alpha=0.3, reward_offset=3.0))[0])
    np.testing.assert_array_equal(got.reward[0, 0], r.reward[p, 2])
    np.testing.assert_allclose(got.q_table[0, 0], r.q_table[p, 2], rtol=1e-4, atol=1e-5)


def test_greedy_ties_are_broken_uniformly_at_random():
    q = jnp.array([1.0, 0.0, 1.0, 1.0])
    act = jax.jit(program.epsilon_greedy)
    picks = [int(act(jnp.array([0.9, u], jnp.float32), q, 0.1)) for u in (0.0, 0.34, 0.67, 0.99)]
    assert picks == [0, 2, 3, 3]
    assert int(act(jnp.array([0.05, 0.3], jnp.float32), q, 0.1)) == 1  # explored: uniform over all 4
    assert int(act(jnp.array([0.9, 0.6], jnp.float32), jnp.array([jnp.nan, 0.0]), 0.1)) == 1  # NaN: all tie


@pytest.mark.parametrize("changes, field", [
    (dict(algorithm="q", hyperparameters={"alpha": 0.1}, gamma=1.5), "gamma"),
    (dict(gamma=[0.9, -0.1]), "gamma"),
    (dict(steps=1050, log_every=100), "steps"),
    (dict(steps=1000, log_every=40), "log_every"),
    (dict(steps=1005, log_every=None), "steps"),
    (dict(task="no_such_task"), "task"),
    (dict(algorithm="no_such_learner"), "algorithm"),
    (dict(hyperparameters={"alpha": 0.1, "beta": 0.2}), "beta"),
    (dict(reward_offset=float("inf")), "reward_offset"),
    (dict(epsilon=1.5), "epsilon"),
    (dict(seeds=0), "seeds"),
    (dict(dtype="float16"), "dtype"),
    (dict(task_params={"size": 3}), "size"),
])
def test_bad_input_one_line_naming_the_field(changes, field):
    base = dict(task="two_choice", algorithm="q_vrc", hyperparameters={"alpha": 0.1, "eta": 0.5}, steps=1000)
    with pytest.raises(ValueError) as e:
        ContinuingSpec(**{**base, **changes})
    msg = str(e.value)
    assert msg.startswith(f"{field}:") and "\n" not in msg, msg


def test_figures_and_rows(learned, tmp_path):
    results = {alg: learned[alg][2] for alg in learned}
    fig = kinds.get("continuing").figures.compare(results, None, "", None)
    assert fig is not None
    paths = kinds.get("continuing").figures.figures(results, str(tmp_path), "last10", None, "")
    assert all(os.path.isfile(p) for p in paths) and any("sensitivity" not in p for p in paths)
    rows = kinds.get("continuing").figures.rows(results, "last10", None)
    assert [row["algorithm"] for row in rows] == ["q_vrc", "diff_q"]
    assert rows[0]["optimal_gain"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="^metric:"):
        kinds.get("continuing").figures.check_metric(results, "auc")


def test_the_front_implements_the_engine_protocol(replayed):
    import inspect

    from bec_jax.engine import execute, protocol
    names = [n for n, v in vars(protocol.Engine).items() if not n.startswith("_") and callable(v)] + \
        list(protocol.Engine.__annotations__)
    assert [n for n in names if not hasattr(sweep, n)] == []
    for n in names:
        if callable(getattr(protocol.Engine, n, None)):
            want = [p for p in inspect.signature(getattr(protocol.Engine, n)).parameters if p not in ("self", "kwargs")]
            have = inspect.signature(getattr(sweep, n)).parameters
            assert all(p in have or "kwargs" in have for p in want), (n, want, list(have))
    assert sweep.run_chunks is execute.run_chunks and sweep.KIND == ContinuingSpec.KIND == ContinuingResult.KIND
    spec, r = replayed
    assert sweep.shared_programs([spec, spec]) == [[0], [1]]  # no joint program yet: each alone
    assert sweep.num_chunks(spec, 2) == 2 and sweep.plan_chunk(spec, 3) == 3
    pl = sweep.plan_memory(spec)
    assert pl.grid >= spec.num_points and not pl.segmented
