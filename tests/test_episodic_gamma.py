"""The `gamma` parameter of an MDP file whose discount is an (S, A, S) array
(an episodic task, White 2017): a number given for it is the discount of the
file's non-terminal transitions, and the zeros that end the episodes stay.

The expected arrays below are built with `np.where(file_gamma > 0, g, 0.0)`: the
loader copies the number onto the same entries, so exact equality is the test.
"""
import json

import numpy as np
import pytest

from bec_jax import envs
from bec_jax import mdp as mdp_lib
from bec_jax.cli import commands as cli
from bec_jax.prediction.results import SweepResult
from bec_jax.theory import fixpoints, metrics


def episodic_fields(nonterminal=0.9, other=None):
    """A 3-state, 2-action episodic task: from state 2 both actions end the
    episode (back to state 0, discount 0); state 1's second action also ends it.
    `other` puts a second nonzero discount on the transitions out of state 1."""
    P = np.array([[[0.1, 0.6, 0.3], [0.0, 0.2, 0.8]],
                  [[0.0, 0.3, 0.7], [1.0, 0.0, 0.0]],
                  [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])
    gamma = np.full((3, 2, 3), nonterminal)
    gamma[2, :, 0] = 0.0
    gamma[1, 1, 0] = 0.0
    if other is not None:
        gamma[1, 0, :] = other
    R = np.arange(18, dtype=float).reshape(3, 2, 3) / 10.0 - 0.4
    env = mdp_lib.make_mdp(pi=np.array([[0.8, 0.2], [0.4, 0.6], [0.5, 0.5]]), mu=np.full((3, 2), 0.5), P=P,
                           R=R, phi=np.array([[1.0, 0.0], [0.6, 0.4], [0.0, 1.0]]), gamma=gamma,
                           start=np.array([1.0, 0.0, 0.0]), theta0=np.array([0.5, -0.5]))
    return env._asdict()


def write_toml(path, fields):
    path.write_text("".join(f"{k} = {json.dumps(np.asarray(v).tolist())}\n" for k, v in fields.items()))


@pytest.fixture()
def episodic_file(tmp_path):
    fields = episodic_fields()
    path = tmp_path / "ep.npz"
    np.savez(path, **fields)
    write_toml(tmp_path / "ep.toml", fields)
    return path, fields["gamma"]


def test_gamma_of_an_episodic_file_keeps_the_zeros(episodic_file, tmp_path):
    path, file_gamma = episodic_file
    for source in (str(path), str(tmp_path / "ep.toml")):
        # The default is the file's one nonzero discount, and it gives the file's array.
        assert envs.parameters(source) == {"gamma": 0.9}
        np.testing.assert_array_equal(envs.make(source).gamma, file_gamma)
        for g in (0.5, 0.0, 0.9):
            got = envs.make(source, gamma=g).gamma
            assert got.shape == (3, 2, 3)
            np.testing.assert_array_equal(got, np.where(file_gamma > 0, g, 0.0))
    # The episodes end where the file says: 3 of 18 entries are 0 whatever gamma is.
    assert int(np.sum(envs.make(str(path), gamma=0.5).gamma == 0)) == int(np.sum(file_gamma == 0)) == 3
    # A scalar file's gamma is still replaced as a whole.
    scalar = dict(episodic_fields(), gamma=np.float64(0.9))
    np.savez(tmp_path / "c.npz", **scalar)
    assert envs.parameters(str(tmp_path / "c.npz")) == {"gamma": 0.9}
    assert float(envs.make(str(tmp_path / "c.npz"), gamma=0.5).gamma) == 0.5


def test_gamma_one_is_allowed_where_the_episodes_still_end(episodic_file):
    path, file_gamma = episodic_file
    env = envs.make(str(path), gamma=1.0)
    np.testing.assert_array_equal(env.gamma, np.where(file_gamma > 0, 1.0, 0.0))
    # Undiscounted within the episode: v solves v = r + P_g v with P_g keeping only the
    # non-terminal transitions; compared with a model built directly.
    direct = mdp_lib.make_mdp(**dict(episodic_fields(nonterminal=1.0)))
    np.testing.assert_array_equal(mdp_lib.v_pi(env), mdp_lib.v_pi(direct))
    # Out of [0, 1], or not a number: one line naming the file and gamma.
    for bad in (1.5, -0.1, "abc", True):
        with pytest.raises(ValueError) as e:
            envs.make(str(path), gamma=bad)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg and ": gamma: " in msg, msg


def test_cli_gamma_sweep_of_an_episodic_file_uses_the_episodic_discount(episodic_file, tmp_path, capsys):
    path, file_gamma = episodic_file
    out = tmp_path / "out"
    code = cli.main(["run", "--env", str(path), "--algorithm", "ctd", "--alpha", "0.05", "--beta", "0.1",
                     "--env-param", "gamma=0.5,0.9", "--steps", "40", "--seeds", "2", "--log-every", "20",
                     "--metrics", "rmsve,rmspbe", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    r = SweepResult.load(str(out))
    assert list(r.grid["gamma"]) == [0.5, 0.9]
    for i, g in enumerate((0.5, 0.9)):
        want = mdp_lib.make_mdp(**dict(episodic_fields(), gamma=np.where(file_gamma > 0, g, 0.0)))
        model = r.spec.mdp({"gamma": g})
        np.testing.assert_array_equal(model.gamma, want.gamma)
        assert mdp_lib.fingerprint(model) == mdp_lib.fingerprint(want)
        np.testing.assert_array_equal(fixpoints.td_fixpoint(model), fixpoints.td_fixpoint(want))
        # Step 0 (theta0 for every seed) is the closed form of the episodic model ...
        for m, name in enumerate(r.metrics):
            exact = getattr(metrics, name)(want, want.theta0)
            assert r.mean[m, i, 0] == pytest.approx(exact, rel=2e-6)
        # ... which differs from that of the continuing task with the constant g.
        cont = mdp_lib.make_mdp(**dict(episodic_fields(), gamma=g))
        assert metrics.rmspbe(cont, cont.theta0) != pytest.approx(metrics.rmspbe(want, want.theta0), rel=1e-3)


def _refused_line(path, capsys, tmp_path, gammas="0.5"):
    out = tmp_path / "out"
    code = cli.main(["run", "--env", str(path), "--algorithm", "td", "--alpha", "0.1", "--env-param",
                     f"gamma={gammas}", "--steps", "20", "--seeds", "2", "--log-every", "10", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bec-jax: error: env: "), err
    assert str(path) in lines[0] and ": gamma: " in lines[0], lines[0]
    assert not out.exists()
    return lines[0]


def test_several_nonzero_discounts_refuse_a_number(tmp_path, capsys):
    path = tmp_path / "mixed.npz"
    fields = episodic_fields(nonterminal=0.9, other=0.5)
    np.savez(path, **fields)
    # Without gamma, the file's array as it is; its parameter has no number to default to.
    assert envs.parameters(str(path)) == {"gamma": None}
    np.testing.assert_array_equal(envs.make(str(path)).gamma, fields["gamma"])
    line = _refused_line(path, capsys, tmp_path, "0.5,0.9")
    assert "0.5, 0.9" in line and "several" in line, line


def test_a_file_where_every_transition_ends_an_episode_refuses_a_number(tmp_path, capsys):
    path = tmp_path / "bandit.npz"
    np.savez(path, **dict(episodic_fields(), gamma=np.zeros((3, 2, 3))))
    assert envs.parameters(str(path)) == {"gamma": None}
    _refused_line(path, capsys, tmp_path)


def test_a_bad_file_discount_is_not_hidden_by_a_given_gamma(tmp_path, capsys):
    path = tmp_path / "neg.npz"
    g = np.asarray(episodic_fields()["gamma"]).copy()
    g[0, 0, 1] = -0.1
    np.savez(path, **dict(episodic_fields(), gamma=g))
    line = _refused_line(path, capsys, tmp_path)
    assert "per-transition discounts must be in [0, 1], got -0.1" in line, line
