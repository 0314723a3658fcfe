"""A run's timing record (import, trace, compile with the persistent cache's
hit or miss, run: `engine.clock`) and the command line's start-up imports."""
import json
import os
import shutil
import subprocess
import sys

from bec_jax.engine import clock

BEC_JAX = shutil.which("bec-jax") or os.path.join(os.path.dirname(sys.executable), "bec-jax")


def test_cache_state_names_what_served_the_programs():
    d = {"trace_s": 0.0, "compile_s": 0.0, "programs": 0, "cache_requests": 0, "cache_hits": 0}
    assert clock.cache_state(d) == "none"
    assert clock.cache_state(dict(d, programs=2)) == "off"
    assert clock.cache_state(dict(d, programs=2, cache_requests=2)) == "miss"
    assert clock.cache_state(dict(d, programs=2, cache_requests=2, cache_hits=1)) == "mixed"
    assert clock.cache_state(dict(d, programs=2, cache_requests=2, cache_hits=2)) == "hit"
    assert clock.since(clock.snapshot()) == {k: 0 for k in d}


def test_run_meta_separates_import_trace_compile_and_run(tmp_path):
    env = dict(os.environ, BEC_JAX_CPU_DEVICES="2", BEC_JAX_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("BEC_JAX_NO_CACHE", None)
    args = ["run", "--env", "boyan_chain", "--algorithm", "td", "--alpha", "0.1,0.5", "--steps", "100",
            "--seeds", "4", "--log-every", "10"]
    timings = []
    for name in ("cold", "warm"):  # the second loads the program kept on disk: nothing traced
        p = subprocess.run([BEC_JAX, *args, "--out", str(tmp_path / name)], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        t = meta["timing"]
        assert t["programs"] == 1 and t["import_s"] > 0 and t["compile_s"] > 0
        assert (t["trace_s"] > 0) == (name == "cold")
        # The sweep's compile seconds span the trace and the compile (and placing the inputs).
        assert t["trace_s"] + t["compile_s"] <= meta["compile_time_s"] + 1e-6
        assert t["run_s"] == meta["run_time_s"]
        assert t["total_s"] >= meta["compile_time_s"] + meta["run_time_s"]
        assert f"(cache {t['cache']})" in p.stdout.splitlines()[0]
        timings.append(t)
    assert [t["cache"] for t in timings] == ["miss", "hit"]
    assert [t["cache_hits"] for t in timings] == [0, 1]


def test_the_command_line_imports_no_plotting_scipy_or_optax_before_its_work():
    code = ("import sys, bec_jax; light = 'jax' not in sys.modules; import bec_jax.cli.commands; "
            "print(light, [m for m in ('scipy', 'matplotlib', 'pandas', 'gymnax', 'tqdm', 'optax')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "True []", out.stdout + out.stderr
