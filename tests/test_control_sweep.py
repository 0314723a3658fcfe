"""The control loop and sweep: epsilon-greedy behaviour, episode logging and
reset against hand-worked steps, the whole program against an independent NumPy
loop (the authors' algorithm, benchmarks/control_numpy.py), reproducibility bit
for bit, independence of chunking, resume and parts, the greedy policy learned
on CliffWalking, and results/figures."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_env import xla_flags

from bec_jax.control import algorithms, loop, sweep, tasks
from bec_jax.control.results import ControlResult, is_control_dir
from bec_jax.control.spec import ControlSpec
from bec_jax.run import rundir, runner
from benchmarks import control_numpy

CLIFF = tasks.make("cliff_walking")


# ------------------------------------------------------------------ behaviour

def test_epsilon_greedy_hand_worked():
    q = jnp.array([1.0, 3.0, 3.0, 0.0])
    # No exploration: the lowest index among the tied maxima.
    assert int(loop.epsilon_greedy(jnp.array([0.5, 0.99]), q, 0.1)) == 1
    # Exploration (u0 < eps): floor(u1 * A), the greedy action included.
    assert int(loop.epsilon_greedy(jnp.array([0.05, 0.99]), q, 0.1)) == 3
    assert int(loop.epsilon_greedy(jnp.array([0.05, 0.0]), q, 0.1)) == 0
    assert int(loop.epsilon_greedy(jnp.array([0.05, 0.3]), q, 0.1)) == 1
    assert int(loop.epsilon_greedy(jnp.array([0.0, 0.5]), q, 0.0)) == 1  # epsilon 0 never explores


def test_authors_epsilon_schedule():
    b = loop.Behaviour(0.01, 0.9992, 1e-4)
    for k in (0, 1, 3000, 10000):
        assert float(b.at(jnp.int32(k))) == pytest.approx(max(0.01 * 0.9992 ** k, 1e-4), rel=1e-5)
    assert float(loop.Behaviour(0.2).at(jnp.int32(50))) == pytest.approx(0.2)


def jitted_step(alg, behaviour, max_episode_steps, **kw):
    """`loop.step` of `alg` (alpha 0.5) on CliffWalking with gamma 0.9, as one
    program (op by op, each of its operations would be compiled alone)."""
    upd = lambda st, tr: alg.apply(st, tr, {"alpha": 0.5})
    return jax.jit(lambda learner, ls, log, key: loop.step(CLIFF, upd, lambda s: s.w, behaviour, max_episode_steps,
                                                           0.9, learner, ls, log, key, **kw))


def test_step_logs_and_resets_hand_worked():
    """Q-learning, greedy (epsilon 0), from the start: ties go to action 0 (up):
    36 -> 24, r = -1; an episode cap of 2 truncates after the second step, logs
    return -2 and length 2, and resets to the start."""
    alg = algorithms.get("q")
    learner = alg.init(jnp.zeros(CLIFF.num_features))
    ls = loop.loop_init(CLIFF, jax.random.key(0))
    log = loop.log_init(3)
    step = jitted_step(alg, loop.Behaviour(0.0), 2)
    learner, ls, log = step(learner, ls, log, jax.random.key(1))
    assert int(ls.env) == 24 and int(ls.t) == 1 and float(ls.ret) == -1.0
    # w[a * 48 + s]: Q(36, up) += 0.5 * (-1 + 0.9 * 0 - 0)
    assert float(learner.w[0 * 48 + 36]) == -0.5
    np.testing.assert_array_equal(np.asarray(ls.active)[:, 0], np.arange(4) * 48 + 24)
    learner, ls, log = step(learner, ls, log, jax.random.key(2))
    # At 24 all four values are 0: up again, to 12; then the cap ends the episode.
    assert float(learner.w[0 * 48 + 24]) == -0.5
    assert int(ls.env) == 36 and int(ls.t) == 0 and float(ls.ret) == 0.0 and int(ls.episodes) == 1
    np.testing.assert_array_equal(np.asarray(log.returns), [-2.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(log.lengths), [2, 0, 0])


# ------------------------------------------------------------------ the program

AUTHORS_BEH = dict(epsilon=0.01, epsilon_decay=0.9992, epsilon_min=1e-4)


@pytest.fixture(scope="module")
def greedy_runs():
    """Every algorithm on CliffWalking with epsilon 0 (deterministic): 2 seeds,
    150 episodes. gamma 1 and step sizes that are powers of 2 keep the arithmetic
    (nearly) exact, so float32 here and float64 in NumPy break ties alike."""
    out = {}
    for name, hp in (("q", {"alpha": 1.0}), ("cq", {"alpha": 0.5, "beta": 2.0 ** -12}),
                     ("gq", {"alpha": 0.5, "zeta": 2.0 ** -6}),
                     ("cgq", {"alpha": 0.5, "beta": 2.0 ** -12, "zeta": 2.0 ** -6})):
        spec = ControlSpec(task="cliff_walking", algorithm=name, hyperparameters=hp, seeds=2, episodes=150,
                           epsilon=0.0, gamma=1.0, block=50)
        out[name] = sweep.run(spec, progress=False)
    return out


@pytest.mark.parametrize("name", ["q", "cq", "gq", "cgq"])
def test_program_equals_the_independent_numpy_loop(greedy_runs, name):
    """With epsilon 0 the runs are deterministic: the compiled program and the
    NumPy loop of the authors' algorithm give the same episode lengths (GQ and CGQ
    differ from the authors' form only at the terminal transition, whose
    correction lands on the goal's weights, which nothing reads)."""
    r = greedy_runs[name]
    hp = {k: float(v[0]) for k, v in r.grid.items()}
    ref = control_numpy.run(name.upper(), 150, seed=0, eps0=0.0, eps_min=0.0, gamma=1.0,
                            **{"alpha": hp["alpha"], "beta": hp.get("beta", 1e-4), "zeta": hp.get("zeta", 0.005)})
    np.testing.assert_array_equal(r.lengths[0, 0], ref["lengths"])
    np.testing.assert_array_equal(r.lengths[0, 1], ref["lengths"])  # no randomness at all
    np.testing.assert_array_equal(r.returns[0, 0], ref["returns"])
    assert ref["lengths"][0] > 100 and ref["lengths"][-1] == 13  # it learned: not a trivial agreement


@pytest.fixture(scope="module")
def cliff_sweep():
    spec = ControlSpec(task="cliff_walking", algorithm="cq", hyperparameters={"alpha": [0.1, 0.3], "beta": [1e-3, 1e-2]},
                       seeds=4, episodes=80, **AUTHORS_BEH)
    return spec, sweep.run(spec, progress=False)


def test_reproducible_bit_for_bit_and_independent_of_the_batch(cliff_sweep):
    """(Chunking: see test_run_to_dir_resume_and_parts.)"""
    spec, r = cliff_sweep
    # A sub-grid and fewer seeds: the same runs (a seed's stream and a point's
    # arithmetic depend on nothing else).
    sub = sweep.run(spec.replace(hyperparameters={"alpha": [0.3], "beta": [1e-2]}, seeds=2), progress=False)
    np.testing.assert_array_equal(sub.lengths[0], r.lengths[3, :2])
    # Seeds differ from each other (exploration is random).
    assert not np.array_equal(r.lengths[0, 0], r.lengths[0, 1])


def test_result_statistics(cliff_sweep):
    spec, r = cliff_sweep
    assert r.lengths.shape == (4, 4, 80) and (r.episodes_done == 80).all()
    # Every episode's return is -(length) - 99 x (cliff falls): never above -length.
    assert (r.returns <= -r.lengths).all()
    a = r.auc_seed("length")
    np.testing.assert_allclose(a, r.lengths.mean(-1))
    b = r.best_index("length")
    assert b == int(np.argmin(r.lengths.mean((1, 2))))
    x, m, lo, hi = r.curve(b)
    np.testing.assert_allclose(m, r.lengths[b].mean(0))
    assert (lo <= m).all() and (m <= hi).all()
    xs, ms, _, _ = r.curve_by_step(b, points=50)
    # At step 1 every run is in its first episode.
    assert ms[0] == pytest.approx(r.lengths[b, :, 0].mean())
    rec = r.summary()[b]
    assert rec["auc_length"] == pytest.approx(a[b].mean())
    assert rec["auc_length_ci_low"] < rec["auc_length"] < rec["auc_length_ci_high"]
    assert rec["omega_mean"] == pytest.approx(float(r.omega[b].mean()), rel=1e-6)


def test_greedy_policy_follows_the_cliff_edge():
    """Q-learning with a small constant epsilon: after training, the greedy path
    from the start reaches the goal along the cliff edge (13 steps) in every seed."""
    spec = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": 0.5}, seeds=5, episodes=300,
                       epsilon=0.05)
    r, state = sweep.final_states(spec)
    assert r.valid.all()
    for n in range(5):
        w = np.asarray(state.w[0, n])
        s, path = 36, []
        while s != 47 and len(path) < 50:
            a = int(np.argmax(w.reshape(4, 48)[:, s]))
            s, _, _ = control_numpy.cliff_step(s, a)
            path.append(s)
        assert len(path) == 13, path
        assert path[0] == 24 and path[-1] == 47 and all(24 <= p <= 35 for p in path[:-1]), path


def test_divergence_is_caught_and_frozen():
    """Q-learning with alpha 50 blows up; the runs are flagged, frozen at a
    block's start, and the point is never 'best'."""
    spec = ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": [0.5, 50.0]}, seeds=2,
                       episodes=20, epsilon=0.1, block=10, divergence_bound=1e4)
    r = sweep.run(spec, progress=False)
    assert (r.diverged_step[1] > 0).all() and (r.diverged_step[1] % 10 == 0).all()
    assert (r.diverged_step[0] == -1).all()
    assert r.best_index() == 0 and np.isnan(r.auc()[1])
    assert r.summary()[1]["diverged_fraction"] == 1.0


# ------------------------------------------------------------------ files, resume, parts

def test_run_to_dir_resume_and_parts(tmp_path, cliff_sweep):
    """Two parts of two chunks (of one point) each, then a resume that assembles:
    bit-equal to the one-chunk run (so results do not depend on the chunking
    either). Chunks of one point: the program of
    test_each_algorithm_reproducible_bit_for_bit_from_the_seed[cq]."""
    spec, r = cliff_sweep
    out = str(tmp_path / "parts")
    for k in (1, 2):
        info = runner.run_to_dir(spec, out, chunk_size=1, part=(k, 2))
        assert info["chunks_total"] == 4 and info["chunks_done"] == 2 * k
    done = runner.run_to_dir(None, out, resume=True)
    for k in ("returns", "lengths", "diverged_step", "omega"):
        np.testing.assert_array_equal(getattr(done, k), getattr(r, k))
    assert done.meta["resumed_chunks"] == 4
    assert is_control_dir(out) and not os.path.isdir(os.path.join(out, "chunks"))
    back = ControlResult.load(out)
    np.testing.assert_array_equal(back.returns, r.returns)
    assert back.spec == spec and back.best_index() == r.best_index()
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert len(summary) == 4 and summary[0]["algorithm"] == "cq"
    # A resume with a different spec names the field.
    out2 = str(tmp_path / "p2")
    rundir.ChunkStore(out2).start(spec, 2, 1, "cpu")
    assert runner.resume_spec(out2) == spec
    with pytest.raises(rundir.RunError, match="episodes"):
        runner.run_to_dir(spec.replace(episodes=81), out2, resume=True)


def test_plot_result_writes_figures(tmp_path, cliff_sweep):
    from bec_jax.control import plotting
    _, r = cliff_sweep
    paths = plotting.plot_result(r, str(tmp_path))
    assert {os.path.basename(p) for p in paths} >= {"curves.png", "sensitivity.png"}
    assert all(os.path.getsize(p) > 1000 for p in paths)


# ------------------------------------------------------------------ spec validation

@pytest.mark.parametrize("change, field", [
    ({"task": "nope"}, "task"), ({"algorithm": "nope"}, "algorithm"), ({"seeds": 0}, "seeds"),
    ({"episodes": 1.5}, "episodes"), ({"epsilon": 1.5}, "epsilon"), ({"epsilon_decay": 0.0}, "epsilon_decay"),
    ({"hyperparameters": {"alpha": -1.0}}, "alpha"), ({"hyperparameters": {"lambda": 0.5, "alpha": 0.1}}, "lambda"),
    ({"hyperparameters": {}}, "alpha"), ({"task_params": {"bogus": 1}}, "bogus"), ({"dtype": "int8"}, "dtype"),
])
def test_spec_refuses_bad_input_naming_the_field(change, field):
    base = dict(task="cliff_walking", algorithm="q", hyperparameters={"alpha": 0.1})
    with pytest.raises(ValueError, match=field):
        ControlSpec(**{**base, **change})


def test_spec_round_trip():
    spec = ControlSpec(task="maze", algorithm="cgq", hyperparameters={"alpha": [0.1, 0.2], "beta": 1e-4, "zeta": 1e-3},
                       **AUTHORS_BEH)
    assert ControlSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.num_points == 2 and spec.episode_cap == 1000 and spec.discount == 0.99
    with pytest.raises(ValueError, match="unknown field"):
        ControlSpec.from_dict({**spec.to_dict(), "steps": 10})


def test_reward_shift_changes_what_is_learned_not_what_is_logged():
    """The shift control: the learner sees r - c, the log keeps r."""
    alg = algorithms.get("q")
    learner = alg.init(jnp.zeros(CLIFF.num_features))
    ls = loop.loop_init(CLIFF, jax.random.key(0))
    log = loop.log_init(2)
    step = jitted_step(alg, loop.Behaviour(0.0), 1, reward_shift=-0.25)
    learner, ls, log = step(learner, ls, log, jax.random.key(1))
    assert float(learner.w[36]) == 0.5 * (-1.0 + 0.25)  # up from the start, r - c = -0.75
    np.testing.assert_array_equal(np.asarray(log.returns), [-1.0, 0.0])  # cap 1: the episode ended, r logged
    with pytest.raises(ValueError, match="reward_shift"):
        ControlSpec(task="cliff_walking", algorithm="q", hyperparameters={"alpha": 0.1}, reward_shift=float("nan"))


@pytest.mark.parametrize("name, hp", [("q", {"alpha": 0.2}), ("cq", {"alpha": 0.2, "beta": 1e-3}),
                                      ("gq", {"alpha": 0.2, "zeta": 0.01}),
                                      ("cgq", {"alpha": 0.2, "beta": 1e-3, "zeta": 0.01})])
def test_each_algorithm_reproducible_bit_for_bit_from_the_seed(name, hp):
    """Two independent builds and runs of the same spec (exploring, so random).
    cliff_sweep's seeds, episodes and exploration at one point: the q and cq
    programs also serve test_sharded_over_devices_equals_one_device and
    test_run_to_dir_resume_and_parts."""
    spec = ControlSpec(task="cliff_walking", algorithm=name, hyperparameters=hp, seeds=4, episodes=80, seed=7,
                       **AUTHORS_BEH)
    a, b = sweep.run(spec, progress=False), sweep.run(spec, progress=False)
    for k in ("returns", "lengths", "diverged_step"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    assert not np.array_equal(a.lengths[0, 0], a.lengths[0, 1])


def test_sharded_over_devices_equals_one_device(tmp_path, cliff_sweep):
    """cliff_sweep's grid split over 3 (fake CPU) devices, its chunk padded (4
    points to 6), and a shared program's runs split over them (a sweep of one
    point and 4 seeds, its runs padded too): the same bits as on one device.
    The one-device runs are this process's, on its CPU (the subprocess runs on
    the CPU): cliff_sweep's program and the q program of
    test_each_algorithm_reproducible_bit_for_bit_from_the_seed."""
    spec, _ = cliff_sweep
    q = spec.replace(algorithm="q", hyperparameters={"alpha": [0.5]})
    out = str(tmp_path / "three.npz")
    code = (
        "import json, sys, jax, numpy as np\n"
        "from bec_jax.control import sweep\n"
        "from bec_jax.control.spec import ControlSpec\n"
        "spec, q = (ControlSpec.from_dict(json.loads(a)) for a in sys.argv[1:3])\n"
        "three = sweep.run(spec, devices=jax.devices(), progress=False)\n"
        "assert len(jax.devices()) == 3 and three.meta['chunk_size'] == 6, three.meta\n"
        # run_many splits the runs (not the points) over the devices
        "pair = sweep.run_many([spec, q], devices=jax.devices())\n"
        "assert pair[0].meta['shared_program'] == ['cq', 'q']\n"
        "keys = ('returns', 'lengths', 'diverged_step')\n"
        "np.savez(sys.argv[3], three_omega=three.omega, **{f'{n}_{k}': getattr(r, k) for n, r in (('three', three),\n"
        "         ('cq', pair[0]), ('q', pair[1])) for k in keys})\n"
        "print('ok')\n")
    env = xla_flags(devices=3)
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", code, json.dumps(spec.to_dict()), json.dumps(q.to_dict()), out], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
    got = np.load(out)
    cpu = jax.devices("cpu")[:1]
    one, q_one = (sweep.run(s, devices=cpu, progress=False) for s in (spec, q))
    for name, ref in (("three", one), ("cq", one), ("q", q_one)):
        for k in ("returns", "lengths", "diverged_step") + (("omega",) if name == "three" else ()):
            np.testing.assert_array_equal(got[f"{name}_{k}"], getattr(ref, k), err_msg=f"{name} {k}")
