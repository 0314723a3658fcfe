"""PuckWorld (`bec_jax.control.continuing.puckworld`) and Naik et al.'s
continuing Pendulum (`csuite.pendulum(**csuite.NAIK_PENDULUM)`): trajectories
recorded from the code of Naik's csuite fork, PuckWorld against an independent
NumPy float64 implementation of its definition, bad parameters, and a short
sweep of the continuing front on PuckWorld against a replay of its actions."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bec_jax.control.continuing import csuite, puckworld, sweep, tasks
from bec_jax.control.continuing.csuite import PendulumState
from bec_jax.control.continuing.puckworld import PuckState
from bec_jax.control.continuing.spec import ContinuingSpec
from bec_jax.control.loop import uniforms

KEY = jax.random.PRNGKey(0)
STEPS = 700  # the NumPy comparison's and the front's runs: one compiled scan of the default task

# Recorded from the code of Naik's csuite fork (github.com/abhisheknaik96/csuite,
# commit 520e83fdb7b62ab322c3aa791caf76dba872d9fa), run once in a scratch venv
# (numpy 2.4, dm-env 1.6, pillow; the fork's source on the path, its package
# __init__ skipped, as it imports gym for its wrappers only).
# PuckWorld: `PuckWorld(**params)`, `start(seed=0)`, then `set_state` of the
# start (puck x, y, velocity x, y, goal x, y), then `step` of each action;
# after each step the state's (puck x, y, velocity x, y) from `get_state()`
# and the reward (the goal stays put: no step reaches goal_update_interval).
# name: (params, start, actions, ((x, y, vx, vy, reward) per step)); 12 digits.
FORK_PUCKWORLD = {
    "default": ({}, (4.35, 0.62, 0.2, -0.15, 1.25, 3.5), [3] * 8 + [0] * 8 + [1] * 10 + [2] * 6 + [3, 1] * 4, (
        (4.39, 0.591828708008, 0.2, -0.135553183594, -4.27984348587),
        (4.43, 0.566370652571, 0.2, -0.122497770549, -4.32649756132),
        (4.47, 0.543364516154, 0.2, -0.110699751874, -4.37150927991),
        (4.5, 0.522574149264, -0.1, -0.100038025264, -4.40767111938),
        (4.48365741602, 0.503786146464, -0.0711063671875, -0.0904031520329, -4.40838266718),
        (4.47274130514, 0.5, -0.0449955410987, 0.0408481168832, -4.40296054035),
        (4.46672903231, 0.507671628187, -0.021399503748, 0.0369139485822, -4.39333298898),
        (4.46514829853, 0.514604385681, -7.60505274477e-05, 0.0333586883289, -4.38745547619),
        (4.46513401558, 0.518431157333, -6.87259407301e-05, 0.0108834208149, -4.3848420156),
        (4.46512110826, 0.51803688016, -6.21068004096e-05, -0.00942720627596, -4.38510065892),
        (4.46510944407, 0.513828092279, -5.61251634556e-05, -0.027781674029, -4.38795526411),
        (4.46509890328, 0.506172177261, -5.07196305742e-05, -0.0443683842763, -4.39316127522),
        (4.4650893777, 0.5, -4.58347159669e-05, 0.029678796736, -4.39736281271),
        (4.46508076954, 0.503135656315, -4.14202777895e-05, 0.00755794734369, -4.39521788415),
        (4.46507299046, 0.502116826581, -3.74310034647e-05, -0.0124323963825, -4.39590694345),
        (4.46506596059, 0.5, -3.3825944565e-05, 0.0152487139687, -4.39734569155),
        (4.46262133044, 0.502863839825, -0.0192929899715, 0.0137800781611, -4.39360455383),
        (4.45655966341, 0.505451857195, -0.0366972632862, 0.012452889766, -4.38740737276),
        (4.44722932394, 0.507790617153, -0.0524252943258, 0.0112535256849, -4.37899444401),
        (4.43494512476, 0.509904126207, -0.0666385255197, 0.0101696748882, -4.36858658862),
        (4.41999155835, 0.511814078745, -0.0794828504362, 0.0091902120481, -4.3563862983),
        (4.40262571709, 0.513540079726, -0.0910901113266, 0.00830508334015, -4.34257893048),
        (4.38307993225, 0.515099845911, -0.101579452437, 0.00750520324512, -4.32733391267),
        (4.36156415881, 0.516509387725, -0.111058542978, 0.0067823612893, -4.31080592789),
        (4.33826813051, 0.517783173593, -0.119624682315, 0.00612913776698, -4.29313606186),
        (4.31336330747, 0.518934278458, -0.127365798703, 0.00553882757999, -4.27445289946),
        (4.28944291344, 0.522412795329, -0.115098929968, 0.0242677932873, -4.25490761186),
        (4.26782634301, 0.529408773277, -0.104013509236, 0.0411929328009, -4.23458239651),
        (4.24829171008, 0.539583438207, -0.0939957487576, 0.0564879764265, -4.21352814136),
        (4.23063849885, 0.552630644071, -0.0849428199224, 0.0703099221376, -4.19180056552),
        (4.21468550563, 0.568273730391, -0.0767617977594, 0.0828006471015, -4.16945788649),
        (4.20026897884, 0.586262682446, -0.0693687070978, 0.0940883639965, -4.14655907991),
        (4.1896792155, 0.603933287614, -0.0434252387176, 0.0850265151924, -4.12661075129),
        (4.17908530429, 0.619901999524, -0.0585052842516, 0.0768374321614, -4.10785895719),
        (4.17053578533, 0.634332731106, -0.0336080950407, 0.069437056991, -4.09164736621),
        (4.16178561826, 0.64737360849, -0.0496336503903, 0.0627494275634, -4.07626947297),
        (4.15490226855, 0.659158491465, -0.0255909069502, 0.0567058978327, -4.06310689823),
        (4.14765779846, 0.669808347502, -0.042388614596, 0.0512444331984, -4.05048213264),
        (4.14213512888, 0.679432493439, -0.0190436558358, 0.0463089737433, -4.03980775072),
        (4.13612028894, 0.688129717581, -0.036471943047, 0.0418488587991, -4.02942983651),
    )),
    "variant": ({"friction": 0.1, "puck_radius": 0.4, "simulation_step_size": 0.04, "act_step_period": 3},
                (0.9, 4.2, -1.5, 2.0, 4.75, 0.3), [1] * 12 + [2] * 12 + [0, 3] * 6, (
        (0.72047872128, 4.43808511488, -1.494023968, 1.976095872, -5.77588003283),
        (0.541668844693, 4.6, -1.48811936192, -0.976238723834, -6.01664783021),
        (0.4, 4.48378604564, 0.741142664032, -0.964570656127, -6.03544245898),
        (0.487270075594, 4.36896108791, 0.720332415478, -0.953042045913, -5.8929882694),
        (0.57206284598, 4.25550852541, 0.699770892347, -0.941651226385, -5.7533648031),
        (0.654407920067, 4.14341195521, 0.679455121856, -0.930396550662, -5.61655498884),
        (0.734334552878, 4.03265517038, 0.659382166755, -0.919276391543, -5.48254353418),
        (0.811871649779, 3.92322215774, 0.639549124897, -0.908289141278, -5.35131700679),
        (0.887047770655, 3.81509709547, 0.619953128825, -0.897433211331, -5.22286391904),
        (0.959891134044, 3.70826435086, 0.600591345353, -0.886707032153, -5.09717481563),
        (1.03042962121, 3.60270847805, 0.581460975155, -0.876109052955, -4.97424236379),
        (1.09869078018, 3.49841421579, 0.562559252367, -0.865637741484, -4.85406144527),
        (1.1656592723, 3.39632392779, 0.555835508179, -0.843339519797, -4.73653040928),
        (1.23182735271, 3.29688807712, 0.549192126611, -0.821307807882, -4.62156650098),
        (1.29720458799, 3.20007493779, 0.542628147166, -0.799539420399, -4.50912749897),
        (1.36180043036, 3.10585316297, 0.536142620823, -0.778031210076, -4.39917131922),
        (1.4256242191, 3.01419178051, 0.529734609905, -0.756780067259, -4.29165601534),
        (1.48868518183, 2.92506018845, 0.523403187945, -0.735782919461, -4.1865397808),
        (1.55099243589, 2.83842815055, 0.517147439545, -0.715036730917, -4.08378095284),
        (1.61255498967, 2.754265792, 0.51096646025, -0.694538502147, -3.98333801863),
        (1.67338174386, 2.67254359502, 0.504859356415, -0.674285269519, -3.88516962362),
        (1.7334814928, 2.59323239466, 0.498825245076, -0.654274104823, -3.78923458237),
        (1.79286292569, 2.51630337451, 0.492863253822, -0.634502114849, -3.69549189204),
        (1.85153462789, 2.44172806262, 0.486972520669, -0.614966440964, -3.60390074885),
        (1.90950508215, 2.36756344219, 0.481152193936, -0.619568386704, -3.51329332191),
        (1.9677401124, 2.29380843692, 0.48735349612, -0.612163265694, -3.42289967211),
        (2.02575591895, 2.21997751365, 0.481528615944, -0.616798715164, -3.33283955),
        (2.08403575944, 2.14655221717, 0.487725419109, -0.609426697445, -3.24301101181),
        (2.14209584065, 2.07304706197, 0.481896093685, -0.614094854554, -3.15354720724),
        (2.20041942663, 1.99994363997, 0.488088504732, -0.60675515355, -3.06433834281),
        (2.25852273049, 1.9267565122, 0.482254839686, -0.611455241123, -2.97553284883),
        (2.3168890225, 1.85396731653, 0.488442962977, -0.604147088948, -2.88701289392),
        (2.37503452198, 1.78109065943, 0.482605061424, -0.608878348275, -2.79894454451),
        (2.43344250528, 1.70860822369, 0.488788998843, -0.601600995288, -2.71120190214),
        (2.49162919775, 1.63603466009, 0.482946961446, -0.60636268569, -2.62397166398),
        (2.55007788171, 1.56385169525, 0.489126812454, -0.599115400063, -2.53712010636),
    )),
}
# Pendulum: `Pendulum()` with the fork's defaults (friction 0.3, torque
# multiplier 2, `dense_reward`, `start_from_bottom`), `start()`, then `step` of
# each action: (angle, velocity, reward) after each step.
FORK_PENDULUM_ACTIONS = [2] * 6 + [0] * 6 + [1] * 3 + [2] * 5
FORK_PENDULUM = (
    (0.0474591935283, 0.367289862828, -9.58715205301),
    (0.150328679459, 0.576670574893, -8.98091505813),
    (0.267355536428, 0.561562776843, -8.2927742809),
    (0.355149830942, 0.34486514106, -7.77615680044),
    (0.384224791394, 0.0195138440994, -7.60311560648),
    (0.347866827522, -0.293538837282, -7.81352049614),
    (0.167564076486, -1.22159124824, -8.99407449521),
    (6.14339199437, -1.64875125514, -9.28263735246),
    (5.82961590433, -1.44574467582, -7.43448676329),
    (5.6207392385, -0.760512334849, -6.2040056906),
    (5.57771881351, 0.117932329931, -5.9361014705),
    (5.7036961432, 0.910194427413, -6.64721968104),
    (5.9977924318, 1.73978411616, -8.46056205014),
    (0.0953124104801, 1.90766071565, -9.64374026016),
    (0.418625780082, 1.36422808123, -7.60066041998),
    (0.619792957161, 0.748184668206, -6.41545173868),
    (0.668436353961, -0.0672529664792, -6.11695437855),
    (0.558568171136, -0.814569792249, -6.7383678716),
    (0.333768433747, -1.25894768478, -8.04237177684),
    (0.0766596543909, -1.23918021333, -9.54737104969),
)


def _puck_state(x, y, vx, vy, gx, gy, counter=0) -> PuckState:
    return PuckState(position=jnp.asarray([x, y], jnp.float32), velocity=jnp.asarray([vx, vy], jnp.float32),
                     goal=jnp.asarray([gx, gy], jnp.float32), counter=jnp.int32(counter))


_RUNS = {}


def _trajectory(env, state, actions, keys=None):
    """(states, rewards) of `env` stepped from `state` by `actions` with the
    task keys `keys` (default: split from KEY), one jitted scan, compiled once
    per task (its name and parameters) and length."""
    tag = (env.name, json.dumps(env.params, sort_keys=True))
    if tag not in _RUNS:

        @jax.jit
        def run(state, actions, keys):
            def body(s, xs):
                s, r = env.step(xs[1], s, xs[0])
                return s, (s, r)

            return jax.lax.scan(body, state, (actions, keys))[1]

        _RUNS[tag] = run
    acts = jnp.asarray(actions, jnp.int32)
    return _RUNS[tag](state, acts, jax.random.split(KEY, acts.shape[0]) if keys is None else keys)


@pytest.mark.parametrize("name", list(FORK_PUCKWORLD))
def test_puckworld_matches_the_forks_code(name):
    params, start, actions, rows = FORK_PUCKWORLD[name]
    env = puckworld.puckworld(**params)
    states, rewards = _trajectory(env, _puck_state(*start), actions)
    want = np.asarray(rows)
    got = np.column_stack([np.asarray(states.position), np.asarray(states.velocity), np.asarray(rewards)])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    goal = np.broadcast_to(np.asarray(start[4:], np.float32), (len(actions), 2))
    np.testing.assert_array_equal(np.asarray(states.goal), goal)
    np.testing.assert_array_equal(np.asarray(states.counter), np.arange(1, len(actions) + 1))
    r = params.get("puck_radius", 0.5)
    assert np.any(want[:, :2] == r) and np.any(want[:, :2] == 5 - r)  # both kinds of wall were hit


def test_naik_pendulum_matches_the_forks_code():
    env = csuite.pendulum(**csuite.NAIK_PENDULUM)
    assert env.params["friction"] == 0.3 and env.params["torque"] == 2.0 and env.params["reward"] == "dense"
    states, rewards = _trajectory(env, env.reset(KEY), FORK_PENDULUM_ACTIONS)
    got = np.column_stack([np.asarray(states.angle), np.asarray(states.velocity), np.asarray(rewards)])
    np.testing.assert_allclose(got, np.asarray(FORK_PENDULUM), rtol=0, atol=2e-5)
    # The angle's wrap at 2 pi is in the trajectory (step 8: 0.17 -> 6.14).
    assert np.any(np.diff(got[:, 0]) > 5)


def test_pendulum_defaults_unchanged():
    base = csuite.pendulum()
    assert base.params["torque"] == 1.0 and base.params["reward"] == "sparse"
    same = csuite.pendulum(torque=1.0, reward="sparse")
    dense = csuite.pendulum(reward="dense")
    s = PendulumState(angle=jnp.float32(2.9), velocity=jnp.float32(1.3))

    @jax.jit
    def steps(s):
        acts = jnp.arange(3)
        return [jax.vmap(env.step, (None, None, 0))(KEY, s, acts) for env in (base, same, dense)]

    (s1, r1), (s2, r2), (s3, r3) = jax.tree_util.tree_map(np.asarray, steps(s))
    for x, y in ((s1.angle, s2.angle), (s1.velocity, s2.velocity), (r1, r2)):
        np.testing.assert_array_equal(x, y)
    # Dense reward, by hand, of the states reached: -(pi - angle)^2 - 0.1 velocity^2.
    a, v = np.asarray(s3.angle, np.float64), np.asarray(s3.velocity, np.float64)
    np.testing.assert_array_equal(a, s1.angle)
    np.testing.assert_allclose(r3, -(math.pi - a) ** 2 - 0.1 * v ** 2, rtol=0, atol=1e-5)
    assert tasks.make("pendulum", **csuite.NAIK_PENDULUM).params == csuite.pendulum(**csuite.NAIK_PENDULUM).params


class NumpyPuck:
    """PuckWorld from its definition (the fork's puckworld.py; the module
    docstring of `bec_jax.control.continuing.puckworld`), NumPy float64. The
    goal's redraws are not ours to make: `step` takes the new goal, used only
    on the steps whose counter is a multiple of the interval."""

    ACC = {0: (0.0, -0.1), 1: (-0.1, 0.0), 2: (0.0, 0.1), 3: (0.1, 0.0)}

    def __init__(self, pos, goal, friction=0.5, interval=300, radius=0.5, dt=0.05, period=4):
        self.pos, self.vel, self.goal = np.array(pos, float), np.zeros(2), np.array(goal, float)
        self.friction, self.interval, self.radius, self.dt, self.period = friction, interval, radius, dt, period
        self.counter = 0

    def step(self, action, new_goal):
        acc = np.array(self.ACC[action])
        for _ in range(self.period):
            self.vel = self.vel + (acc - self.friction * self.vel) * self.dt
            self.pos = self.pos + self.vel * self.dt
        for i in range(2):
            if self.pos[i] < self.radius:
                self.vel[i], self.pos[i] = -0.5 * self.vel[i], self.radius
            if self.pos[i] > 5.0 - self.radius:
                self.vel[i], self.pos[i] = -0.5 * self.vel[i], 5.0 - self.radius
        self.counter += 1
        updated = self.counter % self.interval == 0
        if updated:
            self.goal = np.array(new_goal, float)
        return -math.hypot(*(self.pos - self.goal)), updated


def test_puckworld_against_its_definition_in_numpy():
    """STEPS (700) steps, free running from a state at rest, the goal
    redrawn after steps 300 and 600: the actions mostly push one way for a
    while (runs of 150 steps, up to 6 units at full speed), so the puck meets
    every wall. The reference takes the goal's new draws from the JAX state
    at its updates (and only there)."""
    env = tasks.make("puckworld")
    steps = STEPS
    s0 = _puck_state(3.2, 3.7, 0.0, 0.0, 2.2, 0.8)  # at rest, as `reset` leaves it
    pushes = np.repeat(np.array([3, 2, 1, 0, 3]), 150)
    noise = np.random.default_rng(3).integers(0, 4, steps)
    actions = np.where(np.arange(steps) % 5 == 0, noise, pushes[np.arange(steps) % pushes.size])
    states, rewards = _trajectory(env, s0, actions)
    pos, vel, goal = (np.asarray(x, np.float64) for x in (states.position, states.velocity, states.goal))
    rewards = np.asarray(rewards, np.float64)
    ref = NumpyPuck(np.asarray(s0.position, np.float64), np.asarray(s0.goal, np.float64), interval=300)
    want = {"pos": [], "vel": [], "goal": [], "reward": [], "updated": []}
    for t, a in enumerate(actions):
        r, updated = ref.step(int(a), goal[t])
        for name, v in (("pos", ref.pos), ("vel", ref.vel), ("goal", ref.goal), ("reward", r), ("updated", updated)):
            want[name].append(np.copy(v))
    want = {k: np.asarray(v) for k, v in want.items()}
    np.testing.assert_allclose(pos, want["pos"], rtol=0, atol=5e-5)
    np.testing.assert_allclose(vel, want["vel"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(rewards, want["reward"], rtol=0, atol=5e-5)
    # the goal is the reference's: the start's, then at each update the draw it was given
    np.testing.assert_array_equal(goal, want["goal"].astype(np.float32))
    walls = np.sum((want["pos"] == 0.5) | (want["pos"] == 4.5), axis=0)  # steps at a wall, per axis
    assert np.flatnonzero(want["updated"]).tolist() == [299, 599] and np.all(walls >= 20), walls
    # the goal moved at the updates only, and stayed in the arena
    moved = np.flatnonzero(np.any(np.diff(goal, axis=0) != 0, axis=1)) + 1
    assert list(moved) == [299, 599]
    assert np.all((goal >= 0) & (goal < 5)) and np.all(rewards <= 0) and np.all(rewards >= puckworld.MIN_REWARD)
    np.testing.assert_array_equal(np.asarray(states.counter), np.arange(1, steps + 1) % 300)


def test_puckworld_reset_features_observe_vmap():
    env = tasks.make("puckworld")
    assert (env.num_actions, env.num_active, env.observation_size) == (4, 32, 6)
    assert env.num_features == 4 * 32 * 3 ** 6 == 93_312
    assert tasks.make("puckworld", **env.params).params == env.params
    keys = jax.random.split(KEY, 64)
    acts = jnp.arange(64) % 4

    @jax.jit
    def everything(keys, acts):  # one compilation: reset, observe, features, vmapped and single steps
        s = jax.vmap(env.reset)(keys)
        one = env.step(keys[5], jax.tree_util.tree_map(lambda x: x[5], s), acts[5])
        return s, jax.vmap(env.observe)(s), jax.vmap(env.features)(s), jax.vmap(env.step)(keys, s, acts), one

    s, obs, f, (batch, rb), (one, r1) = everything(keys, acts)
    assert s.position.shape == s.goal.shape == (64, 2) and s.position.dtype == jnp.float32
    p, g = np.asarray(s.position), np.asarray(s.goal)
    assert np.all((p >= 0) & (p < 5)) and np.all((g >= 0) & (g < 5)) and np.all(np.asarray(s.velocity) == 0)
    assert not np.array_equal(p, g)
    np.testing.assert_array_equal(np.asarray(obs), np.column_stack([p, np.zeros((64, 2), np.float32), g]))
    f = np.asarray(f)
    assert f.shape == (64, 4, 32) and f.dtype == np.int32
    per_action = env.num_features // 4
    for b in range(4):  # action b's block, one tile a tiling
        assert np.all((f[:, b] >= b * per_action) & (f[:, b] < (b + 1) * per_action))
        np.testing.assert_array_equal((f[:, b] - b * per_action) // 3 ** 6, np.broadcast_to(np.arange(32), (64, 32)))
    np.testing.assert_array_equal(f[:, 1:] - f[:, :1], np.broadcast_to(np.arange(1, 4)[:, None] * per_action,
                                                                        (64, 3, 32)))
    # the vmapped step equals the single one
    np.testing.assert_allclose(np.asarray(batch.position[5]), np.asarray(one.position), rtol=1e-6)
    assert float(rb[5]) == pytest.approx(float(r1), rel=1e-6)


@pytest.mark.parametrize("name, params, field", [
    ("puckworld", {"friction": -0.1}, "friction"), ("puckworld", {"friction": math.inf}, "friction"),
    ("puckworld", {"goal_update_interval": 0}, "goal_update_interval"),
    ("puckworld", {"goal_update_interval": 2.5}, "goal_update_interval"),
    ("puckworld", {"puck_radius": 2.6}, "puck_radius"), ("puckworld", {"puck_radius": -1}, "puck_radius"),
    ("puckworld", {"simulation_step_size": 0.0}, "simulation_step_size"),
    ("puckworld", {"act_step_period": 0}, "act_step_period"), ("puckworld", {"num_tilings": 0}, "num_tilings"),
    ("puckworld", {"bins": (3, 3)}, "bins"), ("puckworld", {"velocity_bound": 0.0}, "velocity_bound"),
    ("puckworld", {"gamma": 0.9}, "gamma"), ("puckworld", {"width": 6}, "width"),
    ("pendulum", {"torque": math.nan}, "torque"), ("pendulum", {"torque": "2"}, "torque"),
    ("pendulum", {"reward": "shaped"}, "reward"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ValueError, match=f"^{field}:") as e:
        tasks.make(name, **params)
    assert "\n" not in str(e.value)


def test_puckworld_through_the_continuing_front():
    """A tiny sweep of Q-learning on PuckWorld: with epsilon = 1 the actions
    are the step keys' alone (`program`'s stream: step t's key fold_in(stream,
    t), its uniforms the action, fold_in(key, 1) the task's key), so a replay
    of the task with the same keys gives the same block rewards; with epsilon
    = 0.1 the rates are within the reward's bounds."""
    spec = ContinuingSpec(task="puckworld", algorithm="q", hyperparameters={"alpha": 0.1 / 32},
                          epsilon=[0.1, 1.0], gamma=0.9, seeds=2, seed=5, steps=STEPS, log_every=STEPS // 10)
    r = sweep.run(spec, progress=False)
    assert r.reward.shape == (2, 2, 10)
    assert np.all(r.reward <= 0) and np.all(r.reward >= puckworld.MIN_REWARD) and np.all(np.isfinite(r.max_abs_w))
    env = spec.make_task()

    @jax.jit
    def draws(i):
        key = jax.random.fold_in(jax.random.key(spec.seed), spec.seed_offset + i)
        init_key, stream = jax.random.split(key)
        step_keys = jax.vmap(lambda t: jax.random.fold_in(stream, t))(jnp.arange(spec.steps, dtype=jnp.uint32))
        u = jax.vmap(uniforms)(step_keys)
        actions = jnp.minimum((u[:, 1] * 4).astype(jnp.int32), 3)  # epsilon = 1: u[0] < 1 always
        return env.reset(init_key), actions, jax.vmap(lambda k: jax.random.fold_in(k, 1))(step_keys)

    for i in range(spec.seeds):
        _, rewards = _trajectory(env, *draws(i))
        want = np.asarray(rewards, np.float64).reshape(10, -1).mean(1)
        np.testing.assert_allclose(r.reward[r.select(epsilon=1.0)][0, i], want, rtol=1e-5)
