"""The reproductions' shared scaffold (`bec_jax.experiments.reproduction`): the
provisional and the final meta.json, the tables, the report and which earlier
output a reproduction may overwrite. No sweeps run here."""
import csv
import json

from bec_jax import provenance
from bec_jax.experiments import control, paper, reward_centering, tdrc
from bec_jax.experiments.reproduction import Reproduction, cost_seconds, is_output


def test_a_run_marks_its_directory_from_the_start_and_completes_it(tmp_path):
    lines = []
    out = tmp_path / "out"
    run = Reproduction("bec-jax reproduce --paper x", str(out), quick=True, log=lines.append)
    assert json.loads((out / "meta.json").read_text()) == {"kind": "bec-jax reproduce --paper x", "complete": False,
                                                           "quick": True}
    assert lines[0].startswith("bec-jax reproduce --paper x --quick: cpu x") and lines[0].endswith(str(out))
    assert is_output(str(out), "bec-jax reproduce --paper x") and not is_output(str(out), "another")

    rows = [{"a": 1, "b": 0.5}, {"a": 2, "c": "z"}]
    run.write_table(rows, "| a |\n")
    assert (out / "table.md").read_text() == "| a |\n"
    assert list(csv.DictReader(open(out / "table.csv"))) == [{"a": "1", "b": "0.5", "c": ""},
                                                            {"a": "2", "b": "", "c": "z"}]
    # A result's meta names the machine beside its seconds; other records keep only the seconds.
    costs = [{**provenance.collect(), "compile_time_s": 1.0, "run_time_s": 0.25},
             {"compile_time_s": 2.0, "run_time_s": 0.5}]
    assert cost_seconds(costs) == (3.0, 0.75)
    timing = run.timing(costs)
    assert list(timing) == ["device", "import_s", "trace_s", "compile_s", "programs", "cache", "cache_hits", "run_s",
                            "total_s", "sweeps_compile_s"]
    # Nothing compiled since the run started: the clock's seconds are zero, the sweeps' own summed.
    assert (timing["trace_s"], timing["compile_s"], timing["programs"], timing["cache"]) == (0.0, 0.0, 0, "none")
    assert timing["sweeps_compile_s"] == 3.0 and timing["run_s"] == 0.75
    assert timing["device"] == provenance.describe()

    meta = run.finish("# report\n", timing, {"table": rows, "x": float("inf")}, "TABLE", how="summed: ")
    assert (out / "report.md").read_text() == "# report\n"
    saved = json.loads((out / "meta.json").read_text())
    assert saved["kind"] == meta["kind"] and saved["complete"] is True and saved["quick"] is True
    assert list(saved)[-4:] == ["quick", "timing", "table", "x"] and saved["x"] is None  # strict JSON
    assert "jax_version" in saved and saved["timing"]["total_s"] > 0
    assert lines[-2] == "TABLE" and lines[-1].startswith("done in ") and \
        "(summed: trace 0.0 s, compile 0.0 s (cache none), run 0.8 s)" in lines[-1]


def test_each_reproduction_recognises_only_its_own_output(tmp_path):
    for mod in (paper, tdrc, control, reward_centering):
        d = tmp_path / mod.__name__.rsplit(".", 1)[1]
        d.mkdir()
        assert not mod.is_reproduce_dir(str(d))
        (d / "meta.json").write_text(json.dumps({"kind": mod.KIND, "complete": False}))
        assert mod.is_reproduce_dir(str(d))
        mods = (paper, tdrc, control, reward_centering)
        assert [m.is_reproduce_dir(str(d)) for m in mods] == [m is mod for m in mods]
    # paper's output written before meta.json named its kind: recognised by its records.
    old = tmp_path / "old"
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"lemma": {}, "specs": {}, "table": []}))
    assert paper.is_reproduce_dir(str(old)) and not tdrc.is_reproduce_dir(str(old))
    (old / "meta.json").write_text("[1, 2]")  # not an object
    assert not paper.is_reproduce_dir(str(old))
