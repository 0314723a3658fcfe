"""The continuing front's network learners (bec_jax.control.continuing.deep) and
their pieces: the network against NumPy, the replay ring against a deque, the
centered Q-learning error against rlax, rbar's unbiased step size by hand, a
whole update (sync, full or sampled batch, centered loss, Adam) against an
independent float64 NumPy implementation, and the program: a random policy
drives the task exactly as the linear loop does, a run does not depend on its
grid or chunk, the memory plan against XLA's own buffers, bad settings refused
in one line."""
import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax import networks, replay
from bec_jax.agents import reward_centering as rc
from bec_jax.control.continuing import deep, sweep, tasks
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.engine import tuning

# The engine's light compile (the loop emitters at -O1, as it compiles these learners' programs on a CPU)
# for the programs the tests jit themselves: about half XLA's default compile time.
LIGHT = tuning.CPU_LIGHT_OPTIONS if jax.default_backend() == "cpu" else None

# ------------------------------------------------------------------ the network


def test_mlp_is_pytorch_initialised_and_matches_numpy():
    layers = (7, 5, 4, 3)
    params = jax.jit(networks.mlp_init, static_argnums=1, compiler_options=LIGHT)(jax.random.key(3), layers)
    assert [p.w.shape for p in params] == [(7, 5), (5, 4), (4, 3)]
    assert networks.num_params(layers) == sum(p.w.size + p.b.size for p in params)
    for p, fan_in in zip(params, layers[:-1]):  # nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1 / math.sqrt(fan_in)
        assert np.abs(p.w).max() <= bound and np.abs(p.b).max() <= bound
        assert np.abs(p.w).max() > 0.5 * bound  # drawn over the range, not squeezed
    x = np.random.default_rng(0).normal(size=(6, 7)).astype(np.float32)
    h = x.astype(np.float64)
    for i, p in enumerate(params):
        h = h @ np.asarray(p.w, np.float64) + np.asarray(p.b, np.float64)
        h = np.tanh(h) if i < 2 else h
    apply = jax.jit(networks.mlp_apply, compiler_options=LIGHT)
    np.testing.assert_allclose(apply(params, x), h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(apply(params, x[0]), h[0], rtol=1e-5, atol=1e-6)
    assert networks.flops(layers, 10) == 2 * 10 * (35 + 20 + 12)


# ------------------------------------------------------------------ the replay ring


def test_replay_ring_holds_the_last_transitions_as_a_deque_does():
    C, rng = 5, np.random.default_rng(1)
    obs = rng.normal(size=(13, 2)).astype(np.float32)
    buf = replay.replay_init(C, obs[0])
    ref = collections.deque(maxlen=C)
    add, valid, held = (jax.jit(f, compiler_options=LIGHT) for f in (replay.replay_add, replay.valid,
                                                                       replay.transitions))
    for j in range(12):
        a, r = j % 3, float(j) - 0.5
        buf = add(buf, jnp.int32(a), jnp.float32(r), jnp.asarray(obs[j + 1]))
        ref.append((obs[j], a, r, obs[j + 1]))
        slots = np.flatnonzero(np.asarray(valid(buf)))
        assert len(slots) == len(ref) == min(j + 1, C)
        got = sorted(zip(*(np.asarray(x).tolist() for x in held(buf, jnp.asarray(slots)))), key=lambda t: t[2])
        want = sorted(((o.tolist(), a_, r_, n.tolist()) for o, a_, r_, n in ref), key=lambda t: t[2])
        assert got == [(list(o), a_, r_, list(n)) for o, a_, r_, n in want]
    draws = np.asarray(replay.sample_slots(buf, jax.random.key(0), 4000))
    assert set(draws.tolist()) == set(np.flatnonzero(np.asarray(replay.valid(buf))).tolist())
    counts = np.bincount(draws, minlength=C + 1)[np.asarray(replay.valid(buf))]
    assert np.all(np.abs(counts - 800) < 5 * math.sqrt(800 * 0.8 * 0.2) + 1)  # uniform within 5 sigma
    assert replay.nbytes(C, 2) == (C + 1) * (2 * 4 + 8) + 4


# ------------------------------------------------------------------ centering pieces


def test_centered_q_learning_is_rlax_q_learning_less_rbar():
    rlax = pytest.importorskip("rlax")
    rng = np.random.default_rng(2)
    q_tm1, q_t = (jnp.asarray(rng.normal(size=4), jnp.float32) for _ in range(2))
    for a, r, g, rbar in [(1, 0.5, 0.9, 0.0), (3, -1.0, 0.99, 0.25), (0, 2.0, 1.0, -0.5)]:
        want = rlax.q_learning(q_tm1, a, jnp.float32(r), jnp.float32(g), q_t) - rbar
        got = rc.centered_q_learning(q_tm1, jnp.int32(a), jnp.float32(r), jnp.float32(g), q_t, jnp.float32(rbar))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_rbar_unbiased_step_size_by_hand():
    s = rc.rate_init(5.0)  # the first unbiased step forgets the initial 5 (beta = 1)
    beta0 = 0.25
    s = rc.rate_update(s, jnp.asarray([1.0, 3.0]), beta0, unbiased=True)
    assert float(s.trace) == 0.25 and float(s.rbar) == 7.0  # rbar + 1 * mean(signal)
    # o = 0.25 + 0.25 * 0.75 = 0.4375, beta = 0.25 / 0.4375
    s = rc.rate_update(s, jnp.asarray([1.0, 0.0, 9.0]), beta0, unbiased=True, mask=jnp.asarray([True, True, False]))
    np.testing.assert_allclose(float(s.trace), 0.4375)
    np.testing.assert_allclose(float(s.rbar), 7.0 + 0.25 / 0.4375 * 0.5, rtol=1e-6)
    same = rc.rate_update(rc.rate_init(1.5), jnp.asarray([4.0]), 0.0, unbiased=True)  # eta = 0: no move, no 0 / 0
    assert float(same.rbar) == 1.5 and float(same.trace) == 0.0
    const = rc.rate_update(rc.rate_init(1.0), jnp.asarray([3.0]), 0.5)
    assert float(const.rbar) == 2.5 and int(const.count) == 1  # 1 + 0.5 * 3


# ------------------------------------------------------------------ one update against NumPy


def _np_forward(params, x):
    hs, h = [x], x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        h = np.tanh(h) if i < len(params) - 1 else h
        hs.append(h)
    return h, hs


def _np_update(learner, st, state, slots, alpha, eta, gamma):
    """One update of `learner` in float64 NumPy, written from the definition
    (deep's module docstring; Naik et al.'s `_update_params`, Adam as PyTorch's)."""
    params, target, m, v, rbar, o, count, buf = (state[k] for k in
                                                 ("params", "target", "m", "v", "rbar", "o", "count", "buf"))
    count += 1
    if count % (st.sync_period // st.update_period) == 0:
        target = [(w.copy(), b.copy()) for w, b in params]
    obs, acts, rews, n_all = buf
    M = len(acts)
    if slots is None:  # full: every valid slot, next observation the next slot
        idx, mask = np.arange(M), state["valid"]
    else:
        idx, mask = slots, np.ones(len(slots), bool)
    x, a, r, x_next = obs[idx], acts[idx], rews[idx], obs[(idx + 1) % M]
    v_next = _np_forward(target, x_next)[0].max(-1)
    g = 1.0 if learner.differential else gamma
    q, hs = _np_forward(params, x)
    q_sa = q[np.arange(len(idx)), a]
    new_rbar, new_o = rbar, o
    if learner.centering is not None:
        delta = r - rbar + g * v_next - q_sa
        signal = delta if learner.centering == "value" else r - rbar
        beta0 = eta * alpha
        beta = beta0
        if learner.unbiased:
            new_o = o + beta0 * (1 - o)
            beta = beta0 / new_o if new_o > 0 else 0.0
        new_rbar = rbar + beta * signal[mask].mean()
    used = 0.0 if learner.centering is None else new_rbar if st.target_rbar == "new" else rbar
    tgt = r - used + g * v_next
    dq = np.zeros_like(q)
    dq[np.arange(len(idx)), a] = 2 * (q_sa - tgt) * mask / mask.sum()
    grads, d = [], dq
    for i in reversed(range(len(params))):
        grads.insert(0, (hs[i].T @ d, d.sum(0)))
        if i > 0:
            d = (d @ params[i][0].T) * (1 - hs[i] ** 2)
    new_params, new_m, new_v = [], [], []
    for (w, b), (gw, gb), (mw, mb), (vw, vb) in zip(params, grads, m, v):
        layer, mm, vv = [], [], []
        for p, g_, m_, v_ in ((w, gw, mw, vw), (b, gb, mb, vb)):
            m_ = 0.9 * m_ + 0.1 * g_
            v_ = 0.999 * v_ + 0.001 * g_ ** 2
            step = alpha * (m_ / (1 - 0.9 ** count)) / (np.sqrt(v_ / (1 - 0.999 ** count)) + 1e-8)
            layer.append(p - step)
            mm.append(m_)
            vv.append(v_)
        new_params.append(tuple(layer))
        new_m.append(tuple(mm))
        new_v.append(tuple(vv))
    return dict(state, params=new_params, target=target, m=new_m, v=new_v, rbar=new_rbar, o=new_o, count=count)


@pytest.mark.parametrize("name,batch,target", [("cdqn_unbiased", "full", None), ("cdqn_unbiased", 6, "old"),
                                               ("cdqn", 6, None), ("cdqn_simple", "full", None), ("dqn", 6, None),
                                               ("diff_dqn", "full", None)])
def test_an_update_equals_a_numpy_implementation(name, batch, target):
    """Five updates, update_period new transitions before each as a run adds
    them (two target syncs among them), against `_np_update`, which computes
    every bootstrap value afresh (the learner keeps them, `deep.refresh`);
    the unbiased learner with the target of the updated rbar (its default)
    and of rbar before the update (`target_rbar = old`, what Naik et al.'s
    code computes)."""
    learner = deep.LEARNERS[[d.name for d in deep.LEARNERS].index(name)]
    task = tasks.make("catch", features="board", rows=3, columns=2)  # 6 observation entries, 3 actions
    st = deep.resolve_settings(task, {"hidden": [5], "buffer": 16, "batch": batch, "update_period": 4,
                                      "sync_period": 8, "target_rbar": target}, 6, learner.unbiased)
    assert st.target_rbar == target or (target is None and st.target_rbar == ("new" if learner.unbiased else "old"))
    rng = np.random.default_rng(4)
    alpha, eta, gamma = 0.01, 2.0, 0.9
    s = deep.init(jax.random.key(5), st, jnp.zeros(6), alpha)
    buf = s.replay._replace(obs=jnp.asarray(rng.normal(size=(17, 6)), jnp.float32),
                            actions=jnp.asarray(rng.integers(0, 3, 17), jnp.int32),
                            rewards=jnp.asarray(rng.normal(size=17), jnp.float32), count=jnp.int32(23))
    # The ring as a run leaves it, its cache of target values over every slot (`deep.refresh`).
    s = s._replace(replay=buf, rate=s.rate._replace(rbar=jnp.float32(0.3)),
                   values=deep.target_values(st, s.target, buf.obs))
    f64 = lambda tree: [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in tree]  # noqa: E731
    zeros = [(np.zeros(w.shape), np.zeros(b.shape)) for w, b in s.params]
    ref = dict(params=f64(s.params), target=f64(s.target), m=zeros, v=zeros, rbar=0.3, o=0.0, count=0)
    step = jax.jit(lambda s, k, sync: deep.update(learner, st, s, k, alpha, eta, gamma, sync), compiler_options=LIGHT)
    add = jax.jit(replay.replay_add, compiler_options=LIGHT)
    for u in range(5):
        for _ in range(st.update_period):  # the period's transitions, as a run adds them before its update
            buf = add(buf, jnp.int32(rng.integers(0, 3)), jnp.float32(rng.normal()), jnp.asarray(rng.normal(size=6),
                                                                                               jnp.float32))
        s = s._replace(replay=buf)
        c, M = int(buf.count), 17
        ref["buf"] = tuple(np.asarray(x, np.float64 if i in (0, 2) else np.int64) for i, x in enumerate(buf))
        ref["valid"] = (np.arange(M) < c) & (np.arange(M) != c % M)
        key = jax.random.key(10 + u)
        slots = None if st.full else np.asarray(replay.sample_slots(buf, key, st.batch))
        s = step(s, key, deep.synced(st, u + 1))
        ref = _np_update(learner, st, ref, slots, alpha, eta, gamma)
        for got, want in zip(jax.tree_util.tree_leaves(s.params), jax.tree_util.tree_leaves(ref["params"])):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
        for got, want in zip(jax.tree_util.tree_leaves(s.target), jax.tree_util.tree_leaves(ref["target"])):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(float(s.rate.rbar), ref["rbar"], rtol=1e-5, atol=1e-6)
    assert int(s.updates) == 5
    if learner.centering is None:
        assert float(s.rate.rbar) == np.float32(0.3)  # dqn keeps no rbar: it never moves


# ------------------------------------------------------------------ the program

TASK = {"features": "board", "rows": 5, "columns": 3}
SETTINGS = {"hidden": [4], "buffer": 32, "batch": 8, "update_period": 4, "sync_period": 8}
ALPHAS = [0.01, 1e37]  # the second blows the network up (Adam moves every weight by about alpha an update)


def deep_spec(alphas=ALPHAS, **kw):
    return ContinuingSpec(task="catch", task_params=TASK, algorithm="cdqn_unbiased",
                          hyperparameters={"alpha": alphas, "eta": [1.0]}, epsilon=1.0, seeds=2, steps=160,
                          log_every=16, learner_params=SETTINGS, **kw)


@pytest.fixture(scope="module")
def ran():
    return sweep.run(deep_spec())


def test_a_random_policy_drives_the_task_as_the_linear_loop_does(ran):
    """At epsilon = 1 the actions do not depend on the learner: the network
    learner's runs see, step for step, the rewards of the linear loop's runs of
    the same seeds (the same keys for the task and the actions), whatever
    their network does, blown up included."""
    lin = sweep.run(ContinuingSpec(task="catch", task_params=TASK, algorithm="q", hyperparameters={"alpha": [0.1]},
                                   epsilon=1.0, seeds=2, steps=160, log_every=16))
    for i in range(2):
        np.testing.assert_array_equal(ran.reward[i], lin.reward[0])
    assert ran.reward.std() > 0  # the task's rewards, not a constant


def test_divergence_is_marked_per_run(ran):
    assert np.isfinite(ran.max_abs_w[0]).all() and np.isfinite(ran.rate_estimate[0]).all()
    assert not np.isfinite(ran.max_abs_w[1, :, -1]).any()  # alpha = 1e37: every run blown up
    rows = ran.summary()
    assert rows[0]["blown_up_fraction"] == 0.0 and rows[1]["blown_up_fraction"] == 1.0
    assert rows[1]["max_abs_w"] is None and rows[0]["max_abs_w"] == pytest.approx(float(ran.max_abs_w[0].max()))


@pytest.fixture(scope="module")
def other():
    return sweep.run(deep_spec(alphas=[0.05, 0.01, 1e37, 0.003]), chunk_size=2)


def test_a_run_does_not_depend_on_its_grid_or_chunk(ran, other):
    """The same point in another grid, at another place of another chunk, gives
    the same bits: its keys and batches come from its seed alone. (Both grids
    run in chunks of 2 points: one compiled program.)"""
    assert other.meta["compiled_programs"] == 0 or other.meta["compiled_programs"] == ran.meta["compiled_programs"]
    for k in ("reward", "rate_estimate", "max_abs_w"):
        np.testing.assert_array_equal(getattr(other, k)[1:3], getattr(ran, k))


def test_a_search_keeps_the_full_grids_bits(other):
    """Successive halving on the network learner (rate 2: 4 -> 2 -> 1 points):
    every point's curves up to the rung where it stopped are the full grid's,
    bit for bit (its full runs are a one-rung search, `program.runs`); the
    blown-up point (alpha 1e37) is out at the first rung."""
    found = sweep.run(deep_spec(alphas=[0.05, 0.01, 1e37, 0.003]).replace(search={"rate": 2}))
    sched = found.spec.search_schedule()
    assert sched.points == (4, 2) and found.stopped_rung[2] == 0
    for i in range(4):
        e = sched.ends[found.stopped_rung[i]]
        for k in ("reward", "rate_estimate", "max_abs_w"):
            np.testing.assert_array_equal(getattr(found, k)[i, :, :e], getattr(other, k)[i, :, :e])
            assert np.isnan(getattr(found, k)[i, :, e:]).all()


def test_rbar_tracks_the_reward_rate_with_the_offset(ran):
    """cdqn_unbiased's first update takes beta = 1 (rbar the batch's mean TD
    error), later ones beta0 / o: with a random policy rbar settles near the
    task's reward rate (the network's values are small): within the spread of
    the rewards."""
    est = ran.rate_estimate[0, :, -1]
    assert np.all(np.abs(est - ran.reward_rate("all")[0]) < 0.5)


def test_memory_estimate_bounds_xla_buffer_assignment():
    """The network learner's size terms (`sweep.deep_sizes`) against XLA's own
    buffer assignment for a full-batch program (compiled with the options the
    engine gives it), whose update's working arrays dominate: never below it,
    at most 3 times it."""
    from bec_jax.engine import memory

    spec = deep_spec(alphas=[0.01]).replace(learner_params={**SETTINGS, "buffer": 2000, "batch": "full",
                                                             "hidden": [64]})
    groups, chunks = sweep.plan(spec, 1)
    prog = sweep.make_program(spec, groups[0], 1, jax.devices()[:1])
    options = tuning.choose_form(spec, jax.devices()[:1], groups[0], front=sweep).compiler_options
    m = prog.fn.lower(np.uint32(0), sweep.chunk_grid(spec, groups[0], chunks[0])).compile(options).memory_analysis()
    xla = m.temp_size_in_bytes + m.output_size_in_bytes + m.argument_size_in_bytes
    est = memory.call_bytes(sweep.sizes(spec), 1, spec.seeds, 1, False)
    assert 1.0 <= est / xla <= 3.0, (est, xla)


@pytest.mark.parametrize("params,field", [
    ({"optimizer": "adamw"}, "learner_params.optimizer"),
    ({"activation": "gelu"}, "learner_params.activation"),
    ({"layers": [49, 8, 3]}, "learner_params.layers"),
    ({"layers": [50, 8, 4]}, "learner_params.layers"),
    ({"hidden": [64], "layers": [50, 64, 3]}, "learner_params.layers"),
    ({"batch": 200, "buffer": 100}, "learner_params.batch"),
    ({"batch": "all"}, "learner_params.batch"),
    ({"sync_period": 100}, "learner_params.sync_period"),
    ({"buffer": 0}, "learner_params.buffer"),
    ({"learning_rate": 0.1}, "learner_params.learning_rate"),
    ({"target_rbar": "newest"}, "learner_params.target_rbar"),
])
def test_bad_settings_one_line_naming_the_field(params, field):
    with pytest.raises(ValueError, match=rf"^{field}: ") as e:
        ContinuingSpec(task="catch", task_params={"features": "board"}, algorithm="cdqn",
                       hyperparameters={"alpha": [0.01], "eta": [1.0]}, steps=320, learner_params=params)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("changes,field", [
    ({"steps": 330}, "steps"),          # not whole update periods
    ({"log_every": 16, "steps": 320}, "log_every"),  # a block shorter than an update period
    ({"q0": 1.0}, "q0"),
    ({"algorithm": "q", "learner_params": {"hidden": [4]}}, "learner_params"),
    ({"task": "catch", "task_params": {"features": "board"}, "algorithm": "cdqn", "dtype": "float16"}, "dtype"),
])
def test_bad_runs_one_line_naming_the_field(changes, field):
    base = dict(task="catch", task_params={"features": "board"}, algorithm="cdqn",
                hyperparameters={"alpha": [0.01], "eta": [1.0]}, steps=320)
    if changes.get("algorithm") == "q":
        base["hyperparameters"] = {"alpha": [0.1]}
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ContinuingSpec(**{**base, **changes})


def test_command_line_refuses_bad_settings_writing_nothing(tmp_path, capsys):
    from bec_jax.cli.commands import main

    out = tmp_path / "run"
    for extra, field in ((["--learner-param", "optimizer=lion"], "learner_params.optimizer"),
                         (["--learner-param", "batch=20000"], "learner_params.batch"),
                         (["--steps", "3210"], "steps"),
                         (["--learner-param", "buffer=400000", "--memory-budget", "100MB"], "memory_budget")):
        code = main(["continuing", "--task", "catch", "--task-param", "features=board", "--algorithm", "cdqn",
                     "--alpha", "0.01", "--eta", "1", "--seeds", "2", "--steps", "3200", *extra, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and field in err, (extra, err)
        assert not out.exists() or not any(out.iterdir())


def test_parts_and_resume_assemble_the_same_bits_and_the_readers_read_them(ran, tmp_path, capsys):
    """A network learner's sweep as `--chunks` parts, assembled by `--resume`,
    is the one-process run bit for bit (chunks of 2 points: the program of
    `ran`); `compare --stat` and `export` read it as any continuing run."""
    pytest.importorskip("rliable")
    from bec_jax.cli.commands import main
    from bec_jax.control.continuing.results import ContinuingResult

    args = ["continuing", "--task", "catch", "--task-param", "features=board", "--task-param", "rows=5",
            "--task-param", "columns=3", "--algorithm", "cdqn_unbiased", "--alpha", "0.05,0.01,1e37,0.003",
            "--eta", "1", "--epsilon", "1", "--seeds", "2", "--steps", "160", "--log-every", "16",
            "--chunk-size", "2"] + [f"--learner-param={k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                                    for k, v in SETTINGS.items()]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    assert main(args + ["--out", whole]) == 0
    for k in ("1/2", "2/2"):
        assert main(args + ["--out", parts, "--chunks", k]) == 0
    assert main(args + ["--out", parts, "--resume"]) == 0
    a, b = ContinuingResult.load(whole), ContinuingResult.load(parts)
    for name in ("reward", "rate_estimate", "max_abs_w"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(a.reward[1:3], ran.reward)  # and the runs of `ran`, in another grid
    capsys.readouterr()
    # 100 bootstrap samples (the default's intervals are not what this reads)
    assert main(["compare", whole, "--stat", "iqm", "--reps", "100", "--out", str(tmp_path / "cmp.png")]) == 0
    assert "IQM" in capsys.readouterr().out
