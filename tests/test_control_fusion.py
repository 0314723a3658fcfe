"""Special cases of a control algorithm (`Algorithm.case_of`) and the program
members they share (`control.program.fusion`): every declared case is its host's
update at the held hyperparameters, bit for bit, step by step; a program runs
the cases of one algorithm as one member and gives each sweep what it gives
alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control import algorithms, program, sweep
from bec_jax.control.spec import ControlSpec
from bec_jax.control.transition import ControlTransition

D, M, A, STEPS = 24, 3, 3, 40
DECLARED = [a for a in algorithms.ALGORITHMS.values() if a.case_of is not None]


def _transitions(sparse: bool, seed: int = 0):
    """STEPS random transitions, a third of them terminal (discount 0)."""
    rng = np.random.default_rng(seed)
    if sparse:  # indices of the active features, repeats included
        active = rng.integers(0, D, (STEPS, M)).astype(np.int32)
        nxt = rng.integers(0, D, (STEPS, A, M)).astype(np.int32)
    else:
        active = rng.normal(size=(STEPS, D)).astype(np.float32)
        nxt = rng.normal(size=(STEPS, A, D)).astype(np.float32)
    terminal = rng.random(STEPS) < 0.33
    gamma = np.float32(0.9)
    return ControlTransition(active=jnp.asarray(active), next_active=jnp.asarray(nxt),
                             reward=jnp.asarray(rng.normal(size=STEPS).astype(np.float32)),
                             discount=jnp.asarray(np.where(terminal, 0, gamma).astype(np.float32)),
                             gamma=jnp.full((STEPS,), gamma))


def _run(alg, hp: dict, trs):
    """Every state of `alg` along `trs`, from small nonzero weights."""
    w0 = jnp.linspace(-0.5, 0.5, D, dtype=jnp.float32)
    hp = {k: jnp.float32(v) for k, v in hp.items()}

    def step(st, tr):
        st = alg.apply(st, tr, hp)
        return st, st
    return jax.lax.scan(step, alg.init(w0), trs)[1]


HP = {"alpha": 0.3, "beta": 0.05, "zeta": 0.2}


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("alg", DECLARED, ids=[a.name for a in DECLARED])
def test_a_declared_case_is_its_hosts_update_bit_for_bit(alg, sparse):
    trs = _transitions(sparse)
    own = _run(alg, {n: HP[n] for n in alg.names}, trs)
    for host, fixed in program.cases(alg)[1:]:  # every algorithm up the chain
        hp = {n: fixed.get(n, HP[n]) for n in host.names}
        hosted = _run(host, hp, trs)
        for field in own._fields:
            other = "omega" if field == "rbar" and not hasattr(hosted, "rbar") else field
            np.testing.assert_array_equal(getattr(own, field), getattr(hosted, other), err_msg=f"{host.name}.{field}")
        for field in set(hosted._fields) - set(own._fields) - {"omega" if "rbar" in own._fields else ""}:
            assert not np.asarray(getattr(hosted, field)).any(), f"{host.name}.{field} left its init"
        assert np.abs(np.asarray(own.w[-1]) - np.asarray(own.w[0])).max() > 1e-3  # the weights moved


def test_the_comparison_can_fail():
    """A wrong held value (Q as CQ with beta > 0) gives other weights."""
    trs = _transitions(True)
    q = _run(algorithms.get("q"), {"alpha": HP["alpha"]}, trs)
    cq = _run(algorithms.get("cq"), {"alpha": HP["alpha"], "beta": 0.05}, trs)
    assert not np.array_equal(q.w, cq.w)


def _spec(alg, **kw):
    hp = {"alpha": [0.2, 0.5]}
    hp.update({n: [1e-3] for n in algorithms.get(alg).names if n != "alpha"})
    hp.update(kw.pop("hp", {}))
    return ControlSpec(task="cliff_walking", algorithm=alg, hyperparameters=hp, seeds=2, episodes=15,
                       **{"max_steps": 3000, "block": 50, "epsilon": 0.1, **kw})


def _members(specs, keep_state=False):
    return [(f.host.name if f.host is not None else None, [specs[i].algorithm for i in f.sweeps])
            for f in program.fusion(specs, keep_state)]


def test_the_members_of_a_program():
    six = [_spec(a) for a in ("q", "cq", "gq", "cgq", "rcq_simple", "rcq_value")]
    assert _members(six) == [("cgq", ["q", "cq", "gq", "cgq", "rcq_value"]), (None, ["rcq_simple"])]
    # the nearest algorithm they share: Q and CQ run as CQ (no auxiliary weights)
    assert _members([_spec("q"), _spec("cq")]) == [("cq", ["q", "cq"])]
    assert _members([_spec("q"), _spec("gq")]) == [("cgq", ["q", "gq"])]
    assert _members([_spec("gq_authors"), _spec("q")]) == [(None, ["gq_authors"]), (None, ["q"])]
    assert _members([_spec("q")]) == [(None, ["q"])]
    assert _members([_spec("q"), _spec("cq")], keep_state=True) == [(None, ["q"]), (None, ["cq"])]
    # a loop axis the other sweep lacks: its own member
    eps = _spec("cq", hp={"epsilon": [0.05, 0.1]})
    assert _members([_spec("q"), eps]) == [(None, ["q"]), (None, ["cq"])]


@pytest.mark.parametrize("case_of", [("q",), ("cq", {"beta": "zero"}), ("q", {})], ids=["short", "text", "itself"])
def test_a_malformed_declaration_is_refused_naming_the_field(case_of):
    a = algorithms.get("q")
    with pytest.raises(ValueError, match="case_of"):
        algorithms.Algorithm(name="q", init=a.init, update=a.update, hyperparameters=a.hyperparameters,
                             weights="w", case_of=case_of)


def test_a_circular_declaration_is_refused(monkeypatch):
    a = algorithms.get("cq")
    monkeypatch.setitem(algorithms.ALGORITHMS, "cgq", algorithms.Algorithm(
        name="cgq", init=a.init, update=a.update, hyperparameters=a.hyperparameters, weights="w",
        case_of=("cq", {})))
    with pytest.raises(ValueError, match="circle"):
        program.cases(algorithms.get("q"))


def test_fused_sweeps_give_what_each_gives_alone():
    """CQ, value-based reward centering (CQ's case) and GQ run as one CGQ
    member; each sweep's returns, lengths, divergence steps and omega are what
    it gives alone, bit for bit (the same machine and process), though the
    member steps on until its slowest run is done."""
    # GQ at a small step size learns slowly: the member runs on past CQ's last episodes
    fast = {"alpha": [0.5], "beta": [1e-4]}
    specs = [_spec(a, max_episode_steps=500, max_steps=None, hp=hp)
             for a, hp in (("cq", fast), ("rcq_value", fast), ("gq", {"alpha": [0.01]}))]
    joint = sweep.run_many(specs)
    assert joint[0].meta["members"] == [{"runs_as": "cgq", "sweeps": ["cq", "rcq_value", "gq"]}]
    assert joint[0].meta["compiled_programs"] == 1
    for spec, r in zip(specs, joint):
        alone = sweep.run(spec, progress=False)
        for k in ("returns", "lengths", "diverged_step"):
            np.testing.assert_array_equal(getattr(r, k), getattr(alone, k), err_msg=f"{spec.algorithm}.{k}")
        if alone.omega is None:
            assert r.omega is None
        else:
            np.testing.assert_array_equal(r.omega, alone.omega)
    assert joint[2].omega is None and np.abs(joint[0].omega).max() > 0
    # the member ran on past most runs' last episode: omega stopped there (`program.member`)
    assert (joint[0].lengths[..., -1] > 0).all()
    assert joint[0].lengths.sum(-1).max() < joint[2].lengths.sum(-1).max() - 500


def test_the_fusion_emitters_keep_a_member_per_sweep():
    """A program compiled with the fusion emitters (the reproduction's size)
    keeps a member per sweep: there the cases' extra work costs more than the
    compile saves (benchmarks/README.md). Its runs are the same bits."""
    from bec_jax.engine import tuning
    specs = [_spec("q"), _spec("cq")]
    heavy = sweep.run_many(specs, compiler_options=tuning.CPU_COMPILER_OPTIONS)
    assert heavy[0].meta["members"] == [{"runs_as": "q", "sweeps": ["q"]}, {"runs_as": "cq", "sweeps": ["cq"]}]
    light = sweep.run_many(specs)
    assert light[0].meta["members"] == [{"runs_as": "cq", "sweeps": ["q", "cq"]}]
    for a, b in zip(heavy, light):
        for k in ("returns", "lengths", "diverged_step"):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
