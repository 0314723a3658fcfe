"""The sweep engine against plain loops, and its independence properties."""
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_env import xla_flags

from bec_jax import algorithms, envs
from bec_jax.engine import seed_stats, tuning
from bec_jax.prediction import kernel, sampling, streams, sweep
from bec_jax.prediction.plan import plan_groups
from bec_jax.prediction.results import SweepResult
from bec_jax.prediction.spec import ScheduleSpec, SweepSpec
from bec_jax.theory import metrics
from bec_jax.transition import Transition

# 50 seeds: with fewer, a batch-shape-dependent rounding can go unnoticed.
BAIRD = dict(env="baird", algorithm="ctdc", beta=(0.01, 0.1), zeta=(0.01, 0.05), seeds=50,
             steps=200, log_every=20, metrics=("rmscbe", "rmspbe"))
ALPHAS = (0.3, 0.005, 0.01)  # 0.3 diverges on Baird


def choose_form(*args, **kwargs):
    """`tuning.choose_form` for a prediction sweep (its front weighs the work)."""
    return tuning.choose_form(*args, front=sweep, **kwargs)


@pytest.fixture(scope="module")
def full():
    return sweep.run(SweepSpec(alpha=ALPHAS, **BAIRD))


def test_grid_point_independence(full):
    sub = sweep.run(SweepSpec(alpha=(0.01,), **BAIRD))
    # alpha = 0.01 is the last 4 points of the full grid (alpha varies slowest).
    np.testing.assert_array_equal(full.mean[:, 8:], sub.mean)
    np.testing.assert_array_equal(full.final[:, 8:], sub.final)


@pytest.mark.parametrize("chunk", [1, 5])
def test_chunk_size_independence(full, chunk):
    spec = SweepSpec(alpha=ALPHAS, **BAIRD)
    r = sweep.run(spec, chunk_size=chunk)
    assert r.meta["num_chunks"] == -(-12 // sweep.plan_chunk(spec, chunk, len(jax.devices())))
    np.testing.assert_array_equal(full.mean, r.mean)
    np.testing.assert_array_equal(full.std, r.std)
    np.testing.assert_array_equal(full.diverged_step, r.diverged_step)


def test_divergence_is_flagged_and_isolated(full):
    # alpha = 0.3 (first 4 points): every seed of CTDC diverges on Baird; the rest do not.
    assert np.all(full.diverged_fraction[:4] == 1.0)
    assert np.all(full.diverged_fraction[4:] == 0.0)
    assert np.all(full.diverged_step[:4] > 0) and np.all(full.diverged_step[:4] <= 200)
    assert np.all(full.diverged_step[4:] == -1)
    # Statistics of the healthy points are finite; the diverged ones are +inf (the
    # error is unbounded) only once no seed is left alive, and their final per-seed
    # values are +inf. Never NaN.
    assert np.all(np.isfinite(full.mean[:, 4:])) and np.all(np.isfinite(full.std[:, 4:]))
    dead = full.alive[:4] == 0
    for stat in (full.mean, full.std, full.sem):
        assert np.all(stat[:, :4][:, dead] == np.inf) and np.all(np.isfinite(stat[:, :4][:, ~dead]))
        assert not np.isnan(stat).any()
    assert np.all(full.final[:, :4] == np.inf)
    # Best point never picks a diverged setting; summary marks them.
    assert full.best_index() >= 4
    recs = full.summary()
    assert recs[0]["final_mean"] is None and recs[0]["auc"] is None and recs[0]["diverged_fraction"] == 1.0
    assert all(r["final_mean"] is not None for r in recs[4:])


# A low bound makes some, not all, seeds of TD on the 2-state example diverge.
# theta = 2 RMSCBE here; after 1000 steps the seeds' |theta| spread over about 5-10.
PARTLY_DIVERGING = SweepSpec(env="two_state", algorithm="td", alpha=(0.01,), seeds=16, steps=1000, log_every=250,
                             divergence_bound=7.0)


def test_partial_divergence_statistics_use_survivors():
    r = sweep.run(PARTLY_DIVERGING)
    frac = r.diverged_fraction[0]
    assert 0 < frac < 1
    alive_final = r.final[0, 0][np.isfinite(r.final[0, 0])]
    assert len(alive_final) == r.alive[0, -1]
    np.testing.assert_allclose(r.mean[0, 0, -1], alive_final.mean(), rtol=1e-6)
    np.testing.assert_allclose(r.std[0, 0, -1], alive_final.std(), rtol=1e-5)
    np.testing.assert_allclose(r.sem[0, 0, -1], alive_final.std(ddof=1) / np.sqrt(len(alive_final)), rtol=1e-5)


@pytest.mark.parametrize("sampler_kind,alg,steps", [("markov", "ctdc", {"alpha": (0.05,), "beta": (0.1,), "zeta": (0.02,)}),
                                                    ("iid", "tdc", {"alpha": (0.05,), "zeta": (0.02,)})])
def test_sweep_equals_plain_loop(sampler_kind, alg, steps):
    """One grid point, one seed: the sweep's curve equals a Python loop over the
    public update function fed the same transitions."""
    spec = SweepSpec(env="boyan_chain", algorithm=alg, seeds=2, steps=60, log_every=20,
                     sampler=sampler_kind, metrics=("rmscbe", "rmsve"),
                     schedule=ScheduleSpec("robbins_monro", t0=10.0), **steps)
    r = sweep.run(spec)
    env = envs.make("boyan_chain")
    smp = sampling.make_sampler(env, sampler_kind)
    A = algorithms.get(alg)
    step = jax.jit(A.apply)
    key = streams.seed_keys(spec)[1]
    init_key, stream_key = jax.random.split(key)
    s = smp.init(init_key)
    state = A.init(jnp.asarray(env.theta0, jnp.float32))
    vals = [metrics.rmscbe(env, state.theta)]
    replay = streams.seed_transitions(spec, 1)  # the library's replay of the same stream
    for t in range(spec.steps):
        j, i = divmod(t, spec.log_every)
        if i == 0:
            u = jax.random.uniform(jax.random.fold_in(stream_key, j), (spec.log_every, smp.num_uniforms))
        tr, s = smp.step_from_uniforms(u[i], s)
        for a, b in zip(tr, replay):
            np.testing.assert_array_equal(a, b[t])
        fac = dict(zip(("alpha", "beta", "zeta"), ((10.0 / (t + 10.0)) ** p for p in (1.0, 0.6, 0.8))))
        h = {n: float(steps[n][0]) * fac[n] for n in steps}
        state = step(state, tr, h)
        if (t + 1) % spec.log_every == 0:
            vals.append(metrics.rmscbe(env, state.theta))
    np.testing.assert_allclose(r.final[0, 0, 1], vals[-1], rtol=2e-5)
    # The sweep's per-seed values are not logged per step, so check the curve via
    # the seed-1 final value and the mean through a second single-seed sweep.
    np.testing.assert_allclose(r.steps, [0, 20, 40, 60])
    np.testing.assert_allclose(r.final[1, 0, 1], metrics.rmsve(env, state.theta), rtol=2e-5)


def test_curve_matches_loop_at_every_log_point():
    spec = SweepSpec(env="two_state", algorithm="ctd", alpha=(0.01,), beta=(0.1,), seeds=1,
                     steps=90, log_every=30)
    r = sweep.run(spec)
    env = envs.make("two_state")
    trs = streams.seed_transitions(spec, 0)
    state = algorithms.ctd.init(jnp.asarray(env.theta0, jnp.float32))
    expect = [metrics.rmscbe(env, state.theta)]
    for t in range(spec.steps):
        state = algorithms.ctd.update(state, jax.tree.map(lambda x: x[t], trs), 0.01, 0.1)
        if (t + 1) % 30 == 0:
            expect.append(metrics.rmscbe(env, state.theta))
    np.testing.assert_allclose(r.mean[0, 0], expect, rtol=1e-5)
    assert np.all(r.std[0, 0] == 0)


def test_seed_streams_do_not_depend_on_seed_count():
    # 16 seeds: the program of test_partial_divergence_statistics_use_survivors, from the
    # process's memo (the step size is an input); 3 seeds, one of its own.
    b = sweep.run(PARTLY_DIVERGING.replace(hyperparameters={"alpha": (0.005,)}))
    a = sweep.run(PARTLY_DIVERGING.replace(hyperparameters={"alpha": (0.005,)}, seeds=3))
    np.testing.assert_array_equal(a.final[0, 0], b.final[0, 0, :3])
    np.testing.assert_array_equal(a.diverged_step[0], b.diverged_step[0, :3])


def test_save_load_round_trip(full, tmp_path):
    full.save(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["curves.npz", "meta.json", "summary.csv", "summary.json"]
    back = SweepResult.load(str(tmp_path))
    assert back.spec == full.spec
    assert list(back.grid) == ["alpha", "beta", "zeta"]
    for name in ("steps", "alpha", "beta", "zeta", "mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step"):
        np.testing.assert_array_equal(getattr(back, name), getattr(full, name))
    assert back.summary() == full.summary()
    meta = json.load(open(tmp_path / "meta.json"))
    assert meta["jax_version"] == jax.__version__ and meta["compile_time_s"] > 0
    with np.load(tmp_path / "curves.npz") as z:
        assert z["mean"].shape == (12, 11) and z["steps"].shape == (11,)
        np.testing.assert_array_equal(z["mean_rmspbe"], full.mean[1])


def test_best_and_sensitivity(full):
    b = full.best_index()
    auc = full.auc()
    assert auc[b] == auc[np.isfinite(auc)].min()
    sens = full.sensitivity("alpha")
    np.testing.assert_allclose(sens["x"], sorted(ALPHAS))
    assert sens["diverged"][-1] == 1.0 and sens["y"][-1] == np.inf
    fixed = full.sensitivity("beta", fixed={"alpha": 0.01, "zeta": 0.05})
    np.testing.assert_allclose(fixed["y"], full.final_mean()[[9, 11]])
    # Ties go to the lowest index.
    tie = SweepResult(**{**full.__dict__})
    tie.mean = full.mean.copy()
    tie.mean[0, 5] = tie.mean[0, 6] = tie.mean[0, 4] * 0  # equal, smallest
    assert tie.best_index() == 5


_DEVICE_SCRIPT = """
import json, sys
import numpy as np, jax
from bec_jax.engine import tuning
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import SweepSpec
spec = SweepSpec(alpha=(0.3, 0.005, 0.01), **json.loads(sys.argv[1]))
r = sweep.run(spec, chunk_size=int(sys.argv[2]))
# Seed chunks and time segments, the grid sharded over the 4 devices.
s = sweep.run(spec, chunk_size=int(sys.argv[2]), seed_chunk=28, segment_blocks=5)  # 7 seeds a device, 2 segments
# One program for two sweeps, the grid of each split over the devices (TD's 3
# points padded to 4).
j = sweep.run_many([spec, spec.replace(algorithm="td", hyperparameters={"alpha": (0.3, 0.005, 0.01)})])
# The run-fast form (fusion emitters: paired blocks, updates under sharing) over the devices.
f = sweep.run(spec, chunk_size=int(sys.argv[2]), compiler_options=tuning.CPU_COMPILER_OPTIONS)
np.savez(sys.argv[3], mean=r.mean, final=r.final, dstep=r.diverged_step, ndev=len(jax.devices()),
         fast_mean=f.mean, fast_std=f.std, fast_final=f.final, fast_dstep=f.diverged_step,
         joint_mean=j[0].mean, joint_final=j[0].final, joint_td_mean=j[1].mean, joint_td_final=j[1].final,
         joint_td_std=j[1].std, joint_shared=j[1].meta["shared_program"],
         seg_mean=s.mean, seg_std=s.std, seg_sem=s.sem, seg_final=s.final, seg_dstep=s.diverged_step,
         seg_layout=[s.meta["seeds_per_call"], s.meta["blocks_per_segment"]])
"""


@pytest.mark.cpu_only(reason="four fake CPU devices against this process's run on the default device, bit for bit")
def test_device_count_independence(full, tmp_path):
    env = xla_flags(devices=4)
    out = tmp_path / "four.npz"
    cfg = dict(BAIRD, beta=list(BAIRD["beta"]), zeta=list(BAIRD["zeta"]), metrics=list(BAIRD["metrics"]))
    subprocess.run([sys.executable, "-c", _DEVICE_SCRIPT, json.dumps(cfg), "8", str(out)],
                   check=True, env=env)
    z = np.load(out)
    assert int(z["ndev"]) == 4
    np.testing.assert_array_equal(z["dstep"], full.diverged_step)
    # Bitwise: the program has no reduction whose order depends on the batch shape.
    np.testing.assert_array_equal(z["mean"], full.mean)
    np.testing.assert_array_equal(z["final"], full.final)
    for k, v in (("mean", full.mean), ("std", full.std), ("final", full.final), ("dstep", full.diverged_step)):
        np.testing.assert_array_equal(z[f"fast_{k}"], v, err_msg=f"run-fast form over 4 devices: {k}")
    # Seed chunks (the host takes the statistics over seeds): bit for bit too.
    assert z["seg_layout"].tolist() == [28, 5]
    np.testing.assert_array_equal(z["seg_final"], full.final)
    np.testing.assert_array_equal(z["seg_dstep"], full.diverged_step)
    np.testing.assert_array_equal(z["seg_mean"], full.mean)
    np.testing.assert_array_equal(z["seg_std"], full.std)
    np.testing.assert_array_equal(z["seg_sem"], full.sem)
    # A program shared by two sweeps over 4 devices: each sweep's bits, as run alone.
    assert z["joint_shared"].tolist() == ["ctdc", "td"]
    np.testing.assert_array_equal(z["joint_mean"], full.mean)
    np.testing.assert_array_equal(z["joint_final"], full.final)
    td_cfg = {k: v for k, v in BAIRD.items() if k not in ("beta", "zeta")} | {"algorithm": "td"}
    td = sweep.run(SweepSpec(alpha=ALPHAS, **td_cfg))
    np.testing.assert_array_equal(z["joint_td_mean"], td.mean)
    np.testing.assert_array_equal(z["joint_td_std"], td.std)
    np.testing.assert_array_equal(z["joint_td_final"], td.final)


def test_programs_are_reused_in_process_only_where_they_are_the_same():
    """A sweep run again with another base seed reuses the compiled program (the
    seed is an argument) and gets that seed's results, bit for bit those of a
    fresh compile; a change that shapes the program compiles anew."""
    from bec_jax.prediction.spec import SweepSpec
    spec = SweepSpec(env="two_state", algorithm="ctd", alpha=(0.01, 0.02), beta=(0.1,), seeds=4, steps=60,
                     log_every=20)
    a = sweep.run(spec, progress=False)
    b = sweep.run(spec.replace(seed=5), progress=False)
    assert b.meta["compiled_programs"] == 0 and b.meta["compile_time_s"] == 0.0
    assert not np.array_equal(a.final, b.final)
    tuning.clear_compiled()
    fresh = sweep.run(spec.replace(seed=5), progress=False)
    assert fresh.meta["compiled_programs"] == 1
    np.testing.assert_array_equal(fresh.mean, b.mean)
    np.testing.assert_array_equal(fresh.final, b.final)
    other = sweep.run(spec.replace(steps=80), progress=False)
    assert other.meta["compiled_programs"] == 1


# 7 log blocks (odd: the last runs alone) and alpha = 2.0 diverging at the bound 10.
DIVERGING_ODD = SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=(0.05, 2.0), beta=(0.1,), zeta=(0.5,), seeds=5,
                          steps=70, log_every=10, divergence_bound=10.0)


# boyan-ctdc's full compile is the run-fast program test_run_fast_form_gives_the_same_bits[whole]
# then takes from the process's memo (the same spec, devices and form). The other cases have an
# even number of blocks (an odd one costs the paired form a longer compile; boyan-ctdc has it).
@pytest.mark.parametrize("spec", [
    DIVERGING_ODD,
    SweepSpec(env="baird", algorithm="tdc", alpha=(0.01,), zeta=(0.1, 0.5), metrics=("rmspbe", "rmsve"), seeds=4,
              steps=80, log_every=20),
    SweepSpec(env="random_walk", algorithm="td", alpha=(0.1,), env_params={"features": ["dependent"]}, seeds=6,
              steps=40, log_every=10),
], ids=["boyan-ctdc", "baird-tdc", "walk-dependent-td"])
def test_light_and_full_compiles_give_the_same_bits(spec, cpu_backend):
    """The compile options change the compile time, never a result: a one-model
    program gives the same bits with XLA:CPU's loop emitters (the default for short
    sweeps) as with its fusion emitters (the default for long ones)."""
    dev = cpu_backend
    light = sweep.run(spec, progress=False, devices=dev, compiler_options=tuning.CPU_LIGHT_OPTIONS)
    full = sweep.run(spec, progress=False, devices=dev, compiler_options=tuning.CPU_COMPILER_OPTIONS)
    for k in ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step"):
        np.testing.assert_array_equal(getattr(light, k), getattr(full, k), err_msg=k)


def _both_forms(monkeypatch, fn):
    """fn() with the programs in their run-fast form (`tuning.KernelForm`: log
    blocks in pairs, updates under `algorithms.sharing`) and without it, both
    with the fusion emitters: (fast, plain). The form is part of the key of the
    process's compiled programs (`tuning.memo_key`): neither gets a program of
    the other form from it, and one of its own form compiled earlier (by an
    earlier test) is the very program it would compile."""
    out = []
    choose = tuning.choose_form
    for fast in (True, False):
        monkeypatch.setattr(tuning, "choose_form",
                            lambda *a, f=fast, **k: choose(*a, **k)._replace(paired=f, share=f))
        out.append(fn())
    return out


def _assert_same_bits(a, b):
    for k in ("mean", "std", "sem", "alive", "final", "auc_seed", "diverged_step"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)


@pytest.mark.parametrize("case", ["whole", "segmented", "several-models"])
def test_run_fast_form_gives_the_same_bits(monkeypatch, case, cpu_backend):
    """The run-fast form (log blocks two an iteration, each with its first step
    outside its loop; the updates under `algorithms.sharing`) changes how XLA
    holds the state, never a result: every output as without it, with divergence
    (a reverted, frozen run), an odd number of blocks, segments of 3 blocks with
    seed chunks of 2, and a group of two models."""
    dev = cpu_backend  # the forms of XLA:CPU
    opts = tuning.CPU_COMPILER_OPTIONS
    if case == "several-models":
        spec = SweepSpec(env="boyan_chain", algorithm="td", alpha=(0.1, 3.0), env_params={"gamma": [0.5, 0.9]},
                         seeds=3, steps=40, log_every=10, divergence_bound=10.0)
        assert len(plan_groups(spec)[0].models) == 2
    elif case == "segmented":  # 6 blocks: two segments of 3 (a pair and a block alone each)
        spec = DIVERGING_ODD.replace(steps=60)
    else:
        spec = DIVERGING_ODD
    kw = {"seed_chunk": 2, "segment_blocks": 3} if case == "segmented" else {}
    paired, single = _both_forms(monkeypatch, lambda: sweep.run(spec, progress=False, devices=dev,
                                                                 compiler_options=opts, **kw))
    if case == "segmented":
        assert paired.meta["seeds_per_call"] == 2 and paired.meta["blocks_per_segment"] == 3
    d = paired.diverged_step
    assert (d >= 0).any() and (d < 0).any()  # some runs reverted and frozen, some not
    _assert_same_bits(paired, single)


def test_form_follows_the_emitters(cpu_backend):
    cpu = cpu_backend
    assert cpu[0].platform == "cpu"
    spec = DIVERGING_ODD
    for opts in (tuning.CPU_COMPILER_OPTIONS, {}, {"xla_backend_optimization_level": 2}):
        form = choose_form(spec, cpu, compiler_options=opts)
        assert form.emitters == "fusion" and form.paired and form.share
        assert form.compiler_options == (opts or None)  # the user's options, as given
    light = choose_form(spec, cpu, compiler_options=tuning.CPU_LIGHT_OPTIONS)
    assert light.emitters == "loop" and not light.paired and not light.share
    assert choose_form(spec, cpu) == light  # a small sweep: the light compile
    # On a CPU the run-fast form shares the TD error and phi . u of each step (one
    # conditional each, in the peeled and the looped step of both paired blocks);
    # the plain form has only the revert's conditional.
    groups, chunks = sweep.plan(DIVERGING_ODD, 2)
    grid = sweep.chunk_grid(DIVERGING_ODD, groups[0], chunks[0])
    dev = cpu

    def conditionals(fast):
        form = choose_form(DIVERGING_ODD, dev, groups[0],
                                 tuning.CPU_COMPILER_OPTIONS if fast else tuning.CPU_LIGHT_OPTIONS)
        prog = sweep.make_program(DIVERGING_ODD, groups[0], 2, dev, form=form)
        return prog.fn.lower(np.uint32(0), grid).as_text().count("stablehlo.case")

    assert conditionals(False) == 1 and conditionals(True) >= 9


class _Device:
    def __init__(self, platform):
        self.platform = platform


def test_default_form():
    cpu, gpu = jax.devices("cpu")[:1], [_Device("gpu")]
    small = SweepSpec(env="two_state", algorithm="td", alpha=(0.1,), seeds=2, steps=10, log_every=10)
    assert choose_form(small, cpu).compiler_options == tuning.CPU_LIGHT_OPTIONS
    on_gpu = choose_form(small, gpu)
    # Off the CPU: no pairing (never measured to pay there), selects instead of conditionals.
    assert on_gpu.compiler_options is None and not on_gpu.paired and not on_gpu.share
    assert on_gpu.branches == "select" and choose_form(small, cpu).branches == "cond"
    big = small.replace(seeds=10**6, steps=1000)  # 10^9 updates: run time outweighs compile time
    assert choose_form(big, cpu).compiler_options == tuning.CPU_COMPILER_OPTIONS
    assert choose_form(small, cpu, updates=10**9).compiler_options == tuning.CPU_COMPILER_OPTIONS
    multi = SweepSpec(env="boyan_chain", algorithm="td", alpha=(0.1,), env_params={"gamma": [0.5, 0.9]}, seeds=2,
                      steps=10, log_every=10)
    (group,) = plan_groups(multi)
    assert len(group.models) == 2
    assert choose_form(multi, cpu, group).compiler_options == tuning.CPU_COMPILER_OPTIONS
    # The form is part of the cache's key: another form, another program.
    (g,) = plan_groups(small)
    keys = {tuning.memo_key(small, g, 1, cpu, choose_form(small, cpu, compiler_options=o), sweep)
            for o in (None, tuning.CPU_COMPILER_OPTIONS, {})}
    assert len(keys) == 3


def test_sensitivity_panels_keep_labelled_minor_ticks(full):
    """A sensitivity panel drops the minor ticks of a log axis spanning two decades
    or more (unlabelled there, and most of a figure's drawing time) and keeps them
    on a narrower one, where they carry the only labels between the decades."""
    from bec_jax.prediction import plotting
    fig, axes = plotting.new_figure(1, 2)
    plotting.sensitivity_panel(axes[0, 0], full, "alpha", None, None, "wide", None, (1e-2, 1e3))
    plotting.sensitivity_panel(axes[0, 1], full, "alpha", None, None, "narrow", None, (0.2, 1.5))
    wide, narrow = axes[0, 0], axes[0, 1]
    assert wide.yaxis.get_minorticklocs().size == 0  # five decades
    assert narrow.yaxis.get_minorticklocs().size > 0  # 0.2 .. 1.5: less than a decade


# Every built-in algorithm on a random MDP (off-policy: rho varies; dense Gaussian features),
# alpha = 0.6 diverging. Its 4 features, not Baird's 8: the run-fast program of twelve algorithms
# traces in about half the time (most of its trace is batching the sharing's conditionals).
_HP = {"beta": (0.05,), "zeta": (0.05,)}
SHARING_SPECS = [SweepSpec(env="random_mdp", algorithm=name, alpha=(0.01, 0.6), seeds=8, steps=120, log_every=20,
                           metrics=("rmspbe",),
                           **{k: v for k, v in _HP.items() if k in algorithms.get(name).names})
                 for name in algorithms.names()]


def test_run_fast_form_changes_no_bit_of_any_algorithm(monkeypatch, cpu_backend):
    """The run-fast form (updates under `algorithms.sharing`, each TD error and
    dot product computed once a step; log blocks in pairs) in a program shared by
    every built-in algorithm: each gives the same bits as in the plain form."""
    fast, plain = _both_forms(monkeypatch, lambda: sweep.run_many(
        SHARING_SPECS, devices=cpu_backend, compiler_options=tuning.CPU_COMPILER_OPTIONS))
    assert fast[0].meta["shared_program"] == list(algorithms.names())
    for a, b in zip(fast, plain):
        _assert_same_bits(a, b)
    diverged = [r.diverged_fraction[1] > 0 for r in fast]
    assert sum(diverged) >= 6, diverged  # the revert ran in most


def test_sharing_puts_each_shared_value_behind_a_conditional(cpu_backend):
    """`algorithms.shared` is the identity outside `sharing`; inside, XLA gets a
    conditional per TD error and dot product, so it cannot fuse (and recompute)
    them into each consumer; the values are the same, whichever branch runs."""
    alg = algorithms.get("ctdc")
    st = alg.init(jnp.ones(4))._replace(u=jnp.arange(4.0))
    t = Transition(jnp.array([1.0, 0.0, 0.5, 0.0]), jnp.float32(-3.0), jnp.float32(0.9),
                   jnp.array([0.0, 1.0, 0.5, 0.0]), jnp.float32(1.0))
    hp = {"alpha": 0.1, "beta": 0.05, "zeta": 0.05}

    def upd(st, t, token):
        with algorithms.sharing(token):
            return alg.apply(st, t, hp)

    # Arguments, not constants: XLA would fold a constant update at compile time.
    plain = jax.jit(lambda st, t: alg.apply(st, t, hp))
    inside = jax.jit(upd)
    assert "conditional(" not in plain.lower(st, t).compile().as_text()
    assert inside.lower(st, t, jnp.float32(0.5)).compile().as_text().count("conditional(") == 2  # delta, phi . u
    for token in (0.5, -1.0):  # either branch runs: the same values
        for a, b in zip(jax.tree_util.tree_leaves(plain(st, t)), jax.tree_util.tree_leaves(inside(st, t, token))):
            np.testing.assert_array_equal(a, b)


def _padded_halving(x, op, pad, xp=np):
    """The statistics' reduction as first written: pad to a power of two, then halve."""
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    x = xp.concatenate([x, xp.full(x.shape[:-1] + (width - n,), pad, x.dtype)], axis=-1)
    while x.shape[-1] > 1:
        x = op(x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:])
    return x[..., 0]


def test_tree_reduce_is_the_padded_pairwise_halving():
    """`seed_stats.tree_reduce` (which never makes the padded array) gives the bits of the
    padded halving for every seed count, on the host and in a program, signed
    zeros included (on the host -0 + 0 is +0, so the pad's additions must all
    happen; XLA folds x + 0 to x, in both forms)."""
    rng = np.random.default_rng(3)
    in_program = []  # the seed counts also checked in a program
    for n in range(1, 70):
        x = (rng.standard_normal((3, n)) * 10.0 ** rng.integers(-3, 4, (3, n))).astype(np.float32)
        x[0] = -0.0  # every element
        x[1, ::3] = np.inf if n % 2 else -np.inf
        for op, pad in ((np.add, 0.0), (np.minimum, np.inf), (np.maximum, -np.inf)):
            want = _padded_halving(x, op, pad)
            got = seed_stats.tree_reduce(x, op, pad, np)
            assert got.tobytes() == want.tobytes(), (n, op)
        if n in (1, 3, 33, 50, 64):
            in_program.append(x)
    # Every seed count and op in one program a side (one compile each, not one a case); the
    # two sides apart, so that XLA cannot merge their common work into one computation.
    ops = ((jnp.add, 0.0), (jnp.minimum, jnp.inf))
    got = jax.jit(lambda xs: [[seed_stats.tree_reduce(v, op, pad) for op, pad in ops] for v in xs])(in_program)
    want = jax.jit(lambda xs: [[_padded_halving(v, op, pad, jnp) for op, pad in ops] for v in xs])(in_program)
    for x, g, w in zip(in_program, got, want):
        for (op, _), a, b in zip(ops, g, w):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (x.shape[-1], op)
    alive = rng.random((7, 50)) < 0.6
    count = jax.jit(seed_stats.alive_count)(alive)
    assert count.dtype == jnp.int32
    np.testing.assert_array_equal(count, alive.sum(-1))


def test_program_states_are_seed_major(full):
    # The layout the engine's speed rests on (docs/performance.md, "Seed-major state"): every
    # batched state leaf (seeds, grid points, ...), the shared counter unbatched,
    # and the per-seed area sums (metrics, seeds, grid points); the outputs keep
    # the grid first.
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=(0.1, 0.2, 0.3), beta=(0.1,), zeta=(0.1,),
                     seeds=5, steps=20, log_every=10)
    (group,), (chunk,) = sweep.plan(spec, spec.num_points)
    kern = kernel.make_kernel(spec, group, spec.num_points)
    grid = sweep.chunk_grid(spec, group, chunk)

    def start(seed, grid):
        return kern.start(kern.setup(seed, (grid,), 0, spec.seeds), False)[0]

    (states,), samp, dstep, auc0 = jax.eval_shape(start, np.uint32(0), grid)
    assert states.theta.shape == states.u.shape == (5, 3, 4) and states.omega.shape == (5, 3)
    assert states.count.shape == () and dstep.shape == (3, 5) and auc0.shape == (1, 5, 3)
    # The outputs of a run, the module's (2 metrics, 12 points, 50 seeds; no compile of its own):
    assert full.final.shape == (2, 12, 50) and full.diverged_step.shape == (12, 50)


def test_fusion_emitters_update_omega_in_place(cpu_backend):
    # CPU_COMPILER_OPTIONS' copy insertion with region analysis: without it XLA:CPU
    # copied omega, a seed-major (seeds, grid) array, in every step of the loop
    # (two copies in the program's two step loops); the run-fast form lost 5-10%.
    spec = SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=(0.1, 0.2, 0.3), beta=(0.1,), zeta=(0.1,),
                     seeds=5, steps=40, log_every=10)
    (group,), (chunk,) = sweep.plan(spec, spec.num_points)
    prog = sweep.make_program(spec, group, spec.num_points, devices=cpu_backend,
                              form=choose_form(spec, cpu_backend, group, tuning.CPU_COMPILER_OPTIONS))
    lowered = prog.fn.lower(np.uint32(0), sweep.chunk_grid(spec, group, chunk))
    text = lowered.compile(tuning.CPU_COMPILER_OPTIONS).as_text()
    assert "while(" in text and "multiply_add_fusion" in text
    assert re.findall(r"f32\[5,3\]\{1,0\} copy\(", text) == []
    without = {k: v for k, v in tuning.CPU_COMPILER_OPTIONS.items() if k != "xla_cpu_copy_insertion_use_region_analysis"}
    assert re.findall(r"f32\[5,3\]\{1,0\} copy\(", lowered.compile(without).as_text())  # what the option removes
