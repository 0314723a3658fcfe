"""Programs that survive a change of grid: a sweep with other step sizes, or a
grid size within its bucket, compiles nothing (in one process, and in a second
`bec-jax run` with the persistent cache), and the padding changes no real
point's result. Compiles are counted by JAX's own compile events and logs."""
import json
import os
import subprocess
import sys

import jax
import jax.monitoring
import numpy as np
import pytest

from bec_jax.engine import program_cache, tuning
from bec_jax.engine.buckets import bucket
from bec_jax.prediction import sweep
from bec_jax.prediction.spec import ScheduleSpec, SweepSpec

SMALL = dict(env="two_state", algorithm="td", seeds=3, steps=40, log_every=20)
FIVE = (0.01, 0.02, 0.03, 0.04, 0.05)  # bucket 6


class Compiles:
    """Backend compiles of the sweep program (JAX's compile-duration event,
    which names the function; a persistent-cache fetch counts too)."""

    def __init__(self):
        self.names = []
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event, secs, fun_name="", **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            self.names.append(fun_name)

    def take(self) -> int:
        n = sum("sweep_program" in name for name in self.names)
        self.names.clear()
        return n

    def close(self):
        jax.monitoring.unregister_event_duration_listener(self._on)


@pytest.fixture(scope="module")
def compiles():
    c = Compiles()
    yield c
    c.close()


def test_bucket_sizes():
    assert [bucket(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert bucket(33) == 48 and bucket(49) == 64 and bucket(64) == 64
    # The waste bound of the docstring: under a third of the computed points are padding.
    n = np.arange(1, 5000)
    b = np.array([bucket(int(x)) for x in n])
    waste = (b - n) / b
    assert (b >= n).all() and 0.3 < waste.max() < 1 / 3 and waste[n > 64].max() < 1 / 9
    assert bucket(576) == 576 and bucket(577) == 640  # the standard workload sits on an edge


def test_other_step_sizes_and_grid_sizes_in_the_bucket_compile_nothing(compiles):
    tuning.clear_compiled()
    compiles.take()
    a = sweep.run(SweepSpec(alpha=FIVE, **SMALL), progress=False)
    assert compiles.take() == 1 and a.meta["compiled_programs"] == 1
    other = (0.5, 0.02, 0.07, 0.04, 0.3)
    b = sweep.run(SweepSpec(alpha=other, **SMALL), progress=False)
    assert compiles.take() == 0 and b.meta["compiled_programs"] == 0 and b.meta["compile_time_s"] == 0.0
    six = sweep.run(SweepSpec(alpha=FIVE + (0.5,), **SMALL), progress=False)
    assert compiles.take() == 0 and six.meta["compiled_programs"] == 0
    # The same program gives each point its own result (points 2 and 4 are shared).
    np.testing.assert_array_equal(b.final[:, [1, 3]], a.final[:, [1, 3]])
    np.testing.assert_array_equal(six.mean[:, :5], a.mean)
    np.testing.assert_array_equal(six.final[:, 5], b.final[:, 0])
    # The counts can fail: a grid one past the bucket's edge compiles (bucket 8),
    assert sweep.run(SweepSpec(alpha=FIVE + (0.5, 0.6), **SMALL), progress=False).meta["compiled_programs"] == 1
    assert compiles.take() == 1
    # and so does a schedule, which shapes the program.
    rm = SweepSpec(alpha=FIVE, schedule=ScheduleSpec("robbins_monro"), **SMALL)
    assert sweep.run(rm, progress=False).meta["compiled_programs"] == 1 and compiles.take() == 1


def test_padding_changes_no_real_point():
    spec = SweepSpec(alpha=FIVE, **SMALL)
    padded = sweep.run(spec, progress=False)  # one chunk of 6, the last point twice
    assert padded.meta["chunk_size"] == 6
    exact = sweep.run(spec, chunk_size=5, progress=False)  # a chunk of the grid's own size: no padding
    assert exact.meta["chunk_size"] == 5
    for k in ("mean", "std", "sem", "alive", "final", "diverged_step"):
        np.testing.assert_array_equal(getattr(padded, k), getattr(exact, k), err_msg=k)
    assert padded.mean.shape[1] == 5 and padded.meta["updates"] == 5 * 3 * 40  # real points only


def test_an_explicit_chunk_size_is_a_cap():
    spec = SweepSpec(alpha=FIVE + (0.5, 0.6), **SMALL)  # 7 points, bucket 8
    groups, chunks = sweep.plan(spec, 5)
    assert [len(c.indices) for c in chunks] == [5, 5] and [c.n for c in chunks] == [5, 2]
    groups, chunks = sweep.plan(spec, 100)
    assert [len(c.indices) for c in chunks] == [8] and chunks[0].n == 7


_CHILD = r"""
import json, logging, sys
events = {"hit": 0, "miss": 0}
class H(logging.Handler):
    def emit(self, rec):
        msg = rec.getMessage()
        if "sweep_program" in msg:
            events["hit"] += "cache hit" in msg
            events["miss"] += "CACHE MISS" in msg
h = H(level=logging.DEBUG)
log = logging.getLogger("jax._src.compiler")
log.addHandler(h); log.setLevel(logging.DEBUG)
from bec_jax.cli.commands import main
rc = main(sys.argv[1:])
meta = json.load(open(sys.argv[sys.argv.index("--out") + 1] + "/meta.json"))
print(json.dumps({"rc": rc, "compile_time_s": meta["compile_time_s"], "timing": meta["timing"], **events}))
"""


def _cli(tmp_path, name, alphas):
    env = {**os.environ, "BEC_JAX_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BEC_JAX_NO_CACHE", None)
    args = ["run", "--env", "two_state", "--algorithm", "td", "--alpha", ",".join(map(str, alphas)),
            "--steps", "40", "--seeds", "3", "--log-every", "20", "--out", str(tmp_path / name)]
    p = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_run_with_one_more_step_size_compiles_nothing(tmp_path):
    first = _cli(tmp_path, "a", FIVE)
    assert first["miss"] == 1 and first["hit"] == 0  # a fresh cache: compiled, and stored
    assert os.listdir(tmp_path / "cache" / program_cache.SUBDIR)  # and kept whole, keyed before tracing
    second = _cli(tmp_path, "b", FIVE + (0.5,))
    # The same program, loaded whole: nothing traced, and JAX's cache not even asked.
    assert second["miss"] == 0 and second["hit"] == 0
    t = second["timing"]
    assert t["programs"] == 1 and t["trace_s"] == 0.0 and t["cache"] == "hit" and t["cache_hits"] == 1
    # Loading it is not compiling it (a loose bound, the machine may be busy;
    # the 0.3 s goal is benchmarks').
    assert second["compile_time_s"] < max(1.0, 0.5 * first["compile_time_s"])
    # The loaded program computes what a fresh compile does, bit for bit (the
    # same program on the same machine): the first run's, freshly compiled, on
    # the five points the two grids share (every array's first axis is the grid's).
    a, b = np.load(tmp_path / "a" / "curves.npz"), np.load(tmp_path / "b" / "curves.npz")
    assert a.files == b.files and b["grid_alpha"].tolist() == list(FIVE + (0.5,))
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k] if k == "steps" else b[k][:5], err_msg=k)
    # An executable JAX's own cache serves is not kept: it would serialize
    # without its kernels (and fail when run from the file).
    import shutil
    shutil.rmtree(tmp_path / "cache" / program_cache.SUBDIR)
    again = _cli(tmp_path, "d", FIVE + (0.6,))
    assert again["hit"] == 1 and again["miss"] == 0
    assert not (tmp_path / "cache" / program_cache.SUBDIR).exists()


def test_programs_are_kept_on_disk_only_when_their_key_covers_them(tmp_path, monkeypatch):
    """The disk key ignores the grid's values and the seed, changes with the
    chunk size and the spec's shape, and is refused for an algorithm from
    outside bec_jax (its code could change with the key unchanged) and while
    JAX's persistent cache is off."""
    import dataclasses

    from bec_jax import algorithms
    from bec_jax.prediction.plan import plan
    monkeypatch.setattr(program_cache, "cache_dir", lambda: str(tmp_path))
    form = tuning.choose_form(SweepSpec(**SMALL, hyperparameters={"alpha": list(FIVE)}), front=sweep)
    devices = jax.devices()[:1]

    def key(spec, size=6):
        (group,), _ = plan(spec, size)
        return program_cache.file_key(spec, group, size, devices, form, sweep)

    base = SweepSpec(**SMALL, hyperparameters={"alpha": list(FIVE)})
    k = key(base)
    assert k is not None and len(k) == 64
    assert key(SweepSpec(**{**SMALL, "seed": 7}, hyperparameters={"alpha": [0.3, 0.4]})) == k
    assert key(base, size=8) != k
    assert key(SweepSpec(**{**SMALL, "steps": 60}, hyperparameters={"alpha": list(FIVE)})) != k
    assert key(SweepSpec(**{**SMALL, "algorithm": "ctd"}, hyperparameters={"alpha": [0.1], "beta": [0.1]})) != k
    td = algorithms.get("td")
    mine = dataclasses.replace(td, name="td_mine", update=lambda state, tr, hp: td.update(state, tr, hp))
    algorithms.register(mine)
    try:
        assert key(SweepSpec(**{**SMALL, "algorithm": "td_mine"}, hyperparameters={"alpha": list(FIVE)})) is None
    finally:
        algorithms._REGISTRY.pop("td_mine", None)
    monkeypatch.setattr(program_cache, "cache_dir", lambda: None)  # JAX's persistent cache off
    assert key(base) is None


def test_control_programs_are_kept_on_disk_only_for_tasks_the_key_follows(tmp_path, monkeypatch):
    """A control task of bec_jax's own (a registered task, a gymnax task with a
    built-in feature map, with gymnax's version in the key) is kept; a task or
    feature map from a user's module (which could change with the key
    unchanged) is not."""
    from bec_jax.control import sweep as control
    from bec_jax.control.spec import ControlSpec
    monkeypatch.setattr(program_cache, "cache_dir", lambda: str(tmp_path))
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples.gridworld
    devices = jax.devices()[:1]

    def key(**kw):
        spec = ControlSpec(algorithm="q", hyperparameters={"alpha": [0.5]}, seeds=2, episodes=3, **kw)
        (group,), _ = control.plan(spec, 1)
        return program_cache.file_key(spec, group, 1, devices, tuning.choose_form(spec, devices, front=control), control)

    assert key(task="cliff_walking") is not None
    assert key(task="examples.gridworld:make_gridworld") is None
    pytest.importorskip("gymnax")
    box = {"low": -1.0, "high": 1.0}
    tiles = key(task="gymnax:CartPole-v1", task_params={"features": "tiles", **box})
    assert tiles is not None and tiles != key(task="gymnax:CartPole-v1", task_params={"features": "fourier", **box})
    mine = key(task="gymnax:CartPole-v1", task_params={"features": "bec_jax.control.features:fourier", **box})
    assert mine is None  # a package.module:function map is not followed, even one of ours


def test_a_control_task_registered_again_compiles_again():
    """The process's program cache follows a control task's factory, not just
    its name: a task registered again under the same name with other dynamics
    gets its own program."""
    import dataclasses

    from bec_jax.control import sweep as control
    from bec_jax.control import tasks
    from bec_jax.control.spec import ControlSpec

    def short(**p):
        return dataclasses.replace(tasks.cliff_walking(**p), name="reuse_test_task")

    def reward_two(**p):
        env = short(**p)
        return dataclasses.replace(env, step=lambda k, s, a: (lambda n, r, t: (n, 2 * r, t))(*env.step(k, s, a)))

    kw = dict(task="reuse_test_task", algorithm="q", hyperparameters={"alpha": [0.5]}, seeds=2, episodes=3,
              max_steps=300, block=50)
    tasks.register("reuse_test_task", short)
    try:
        a = control.run(ControlSpec(**kw), progress=False)
        tasks.register("reuse_test_task", reward_two, replace=True)
        b = control.run(ControlSpec(**kw), progress=False)
    finally:
        tasks.TASKS.pop("reuse_test_task", None)
    assert b.meta["compiled_programs"] == 1
    np.testing.assert_array_equal(b.returns, 2 * a.returns)


def test_a_control_sweep_with_other_step_sizes_reuses_its_program():
    from bec_jax.control import sweep as control
    from bec_jax.control.spec import ControlSpec
    base = dict(algorithm="q", task="cliff_walking", seeds=2, episodes=5, max_steps=400, block=50)
    tuning.clear_compiled()
    a = control.run(ControlSpec(hyperparameters={"alpha": [0.5, 0.2, 0.1]}, **base), progress=False)
    b = control.run(ControlSpec(hyperparameters={"alpha": [0.3, 0.2, 0.05]}, **base), progress=False)
    assert a.meta["compiled_programs"] == 1 and b.meta["compiled_programs"] == 0
    np.testing.assert_array_equal(a.returns[1], b.returns[1])  # alpha 0.2 in both
    assert not np.array_equal(a.returns[0], b.returns[0])
    # alone (4 points, its own bucket) and together with another sweep, the same runs
    c = control.run(ControlSpec(hyperparameters={"alpha": [0.2, 0.5, 0.1, 0.3]}, **base), progress=False)
    assert c.meta["compiled_programs"] == 1
    np.testing.assert_array_equal(c.returns[0], a.returns[1])


def test_a_sweep_in_several_chunks_keeps_its_chunk_size_within_a_bucket():

    def chunk(points):  # 200 seeds: more runs than the CPU cache-sized call holds, so several chunks
        spec = SweepSpec(env="boyan_chain", algorithm="ctdc", alpha=tuple(np.linspace(1e-3, 1e-2, points)),
                         beta=(0.1,), zeta=(0.1,), seeds=200, steps=1000)
        return sweep.plan_memory(spec, 1, device=jax.devices("cpu")[0]).grid

    # 1000 points in 7 balanced chunks of 143 run as 144, a bucket size, as do 1001-1008;
    # 1010 needs chunks of 145, the next bucket (160).
    assert chunk(1000) == chunk(1001) == chunk(1008) == 144 == bucket(143)
    assert chunk(1010) == 160
