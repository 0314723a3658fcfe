"""`bec-jax export` (`bec_jax.cli.export`, `bec_jax.run.export`): tiny
prediction (one point diverges), control and continuing sweeps and a study,
exported once per module to TensorBoard and to W&B (offline) with per-seed
runs, then read back with TensorBoard's own `EventAccumulator` and W&B's
record format, every value compared with curves.npz and summary.json; the
HParams plugin data and W&B's config, names and groups; the one-line errors
(an unknown target, a missing extra, a non-empty OUT, a folder with no run)
and --overwrite deleting only what an export wrote."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import struct
import sys

import numpy as np
import pytest
from docs_blocks import code

from bec_jax.cli import export as cli_export
from bec_jax.cli.args import Parser
from bec_jax.cli.commands import main
from bec_jax.run import export, kinds

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

PRED = ["run", "--env", "baird", "--algorithm", "td", "--alpha", "0.01,0.05,0.5", "--steps", "300", "--seeds", "3",
        "--log-every", "50"]
CTL = ["control", "--task", "cliff_walking", "--algorithm", "cgq", "--alpha", "0.1,0.3", "--beta", "0.001",
       "--zeta", "0.005", "--episodes", "20", "--seeds", "3", "--epsilon", "0.05"]
CONT = ["continuing", "--task", "two_choice", "--algorithm", "q_vrc", "--alpha", "0.1,0.3", "--eta", "1",
        "--gamma", "1", "--seeds", "3", "--steps", "1000"]
STUDY = """seeds = 3
steps = 100
log_every = 50
[[sweep]]
name = "first"
env = "two_state"
algorithm = "ctd"
alpha = [0.01, 0.05]
beta = [0.1, 0.5]
[[sweep]]
name = "second"
env = "boyan_chain"
algorithm = "td"
alpha = [0.1, 0.5]
"""
SIZE = {"size_guidance": {"scalars": 0, "tensors": 0}}  # keep every event, not a sample


def export_main(argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `bec-jax export ARGV`, through a parser
    holding `bec_jax.cli.export`'s subcommand and `main`'s error handling."""
    p = Parser(prog="bec-jax", allow_abbrev=False)
    cli_export.add_parser(p.add_subparsers(dest="command", required=True, parser_class=Parser), cli_export.command)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = p.parse_args(["export", *argv])
            rc = args.func(args)
        except ValueError as e:  # commands.main's: one line, exit 2
            print(f"bec-jax: error: {e}", file=sys.stderr)
            rc = 2
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: directory} of the four tiny runs (the study's folder as "study")."""
    root = tmp_path_factory.mktemp("runs")
    quiet = contextlib.redirect_stdout(io.StringIO())
    with quiet:
        for name, argv in (("pred", PRED), ("ctl", CTL), ("cont", CONT)):
            assert main(argv + ["--out", str(root / name)]) == 0, name
        (root / "s.toml").write_text(STUDY)
        assert main(["study", str(root / "s.toml"), "--out", str(root / "study")]) == 0
    return {n: str(root / n) for n in ("pred", "ctl", "cont", "study")}


@pytest.fixture(scope="module")
def tb(runs, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tb") / "tb")
    rc, stdout, err = export_main([runs["pred"], runs["ctl"], runs["cont"], runs["study"], "--to", "tensorboard",
                                   "--out", out, "--per-seed"])
    assert rc == 0, err
    return out, stdout


@pytest.fixture(scope="module")
def wb(runs, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("wb") / "wb")
    rc, stdout, err = export_main([runs["pred"], runs["ctl"], runs["cont"], runs["study"], "--to", "wandb",
                                   "--out", out, "--per-seed", "--project", "tests"])
    assert rc == 0, err
    return out, stdout


def sweeps(runs) -> dict[str, str]:
    """{sweep name as exported from several DIRs: its directory}."""
    return {"pred": runs["pred"], "ctl": runs["ctl"], "cont": runs["cont"],
            "study/first": os.path.join(runs["study"], "first"), "study/second": os.path.join(runs["study"], "second")}


def expected(d: str) -> list[dict]:
    """What each run of sweep directory `d` must hold, computed from curves.npz
    and summary.json (not from bec_jax's results): one dict per exported run,
    grid points first, then each point's seeds: name, grid, curves {tag:
    (x, y)} and finals {tag: value}, finite values only."""
    z = dict(np.load(os.path.join(d, "curves.npz")))
    rows = json.load(open(os.path.join(d, "summary.json")))
    grid = {k[5:]: v for k, v in z.items() if k.startswith("grid_")}
    r = kinds.load_result(d)
    names = export.point_names(r)
    points, seeds = [], []
    for i, row in enumerate(rows):
        g = {c: float(v[i]) for c, v in grid.items()}
        finals = {f"final/{k}": float(v) for k, v in row.items()
                  if k not in g and isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)}
        if "mean" in z:  # prediction: means by step, each seed's area under its first metric
            metrics = [k[5:] for k in z if k.startswith("mean_")]
            curves = {f"curves/{m}": (z["steps"], z[f"mean_{m}"][i]) for m in metrics}
            curves["curves/alive"] = (z["steps"], z["alive"][i])
            per = [({}, z[f"auc_seed_{metrics[0]}"][i, k]) for k in range(r.seeds)]
        elif "returns" in z:  # control: by episode; all runs of these settings finish
            x = np.arange(1, z["returns"].shape[2] + 1)
            curves = {"curves/return": (x, z["returns"][i].mean(0)), "curves/length": (x, z["lengths"][i].mean(0))}
            per = [({"seed/curve": (x, z["returns"][i, k])}, z["returns"][i, k].astype(np.float64).mean()) for k in range(r.seeds)]
        else:  # continuing: by step at the end of each block
            x = np.arange(1, z["reward"].shape[2] + 1) * r.block_steps
            curves = {f"curves/{t}": (x, z[n][i].mean(0)) for t, n in
                      (("reward_rate", "reward"), ("rate_estimate", "rate_estimate"), ("max_abs_w", "max_abs_w"))}
            per = [({"seed/curve": (x, z["reward"][i, k])}, z["reward"][i, k].astype(np.float64).mean()) for k in range(r.seeds)]
        points.append({"name": names[i], "grid": g, "curves": curves, "finals": finals})
        for k, (c, score) in enumerate(per):
            fin = {"seed/score": float(score)} if np.isfinite(score) else {}
            seeds.append({"name": f"{names[i]}/seed_{k}", "grid": {**g, "seed": k}, "curves": c, "finals": fin})
    return points + seeds


def finite(x, y):
    x, y = np.asarray(x), np.asarray(y, np.float64)
    return x[np.isfinite(y)], y[np.isfinite(y)]


def test_tensorboard_scalars_match_curves_npz(runs, tb):
    out, _ = tb
    n_runs = n_values = 0
    for sweep, d in sweeps(runs).items():
        for want in expected(d):
            acc = EventAccumulator(os.path.join(out, sweep, want["name"]), **SIZE).Reload()
            tags = acc.Tags()["scalars"]
            assert set(tags) == set(want["curves"]) | set(want["finals"]), (sweep, want["name"])
            for tag, (x, y) in want["curves"].items():
                x, y = finite(x, y)
                ev = acc.Scalars(tag)
                assert [e.step for e in ev] == x.tolist(), (sweep, want["name"], tag)
                # TensorBoard keeps a scalar as a float32: compared after rounding to one, closely.
                np.testing.assert_allclose([e.value for e in ev], y.astype(np.float32), rtol=2e-6, atol=1e-30,
                                           err_msg=f"{sweep} {want['name']} {tag}")
                n_values += len(ev)
            for tag, v in want["finals"].items():
                (e,) = acc.Scalars(tag)
                assert e.step == 0 and e.value == pytest.approx(np.float32(v), rel=2e-6, abs=1e-30), (tag, v)
                n_values += 1
            n_runs += 1
    # 3 + 2 + 2 + 4 + 2 points, 3 seeds each; every value of every run came back.
    assert n_runs == 13 * 4 and n_values > 1000


def test_diverged_points_leave_out_their_inf_values(runs, tb):
    out, _ = tb
    z = np.load(os.path.join(runs["pred"], "curves.npz"))
    assert np.isinf(z["mean"][2]).any() and np.isinf(z["auc_seed_rmscbe"][2]).all()  # alpha=0.5 diverged
    acc = EventAccumulator(os.path.join(out, "pred", "alpha=0.5"), **SIZE).Reload()
    steps = [e.step for e in acc.Scalars("curves/rmscbe")]
    assert steps == z["steps"][np.isfinite(z["mean"][2])].tolist() and len(steps) < len(z["steps"])
    assert "final/auc" not in acc.Tags()["scalars"] and "final/diverged_fraction" in acc.Tags()["scalars"]
    seed = EventAccumulator(os.path.join(out, "pred", "alpha=0.5", "seed_0"), **SIZE).Reload()
    assert seed.Tags()["scalars"] == []  # its score is +inf and a prediction run keeps no per-seed curve


def session_hparams(run_dir: str) -> dict:
    """{name: value} of the HParams session a TensorBoard run starts."""
    acc = EventAccumulator(run_dir, **SIZE).Reload()
    data = acc.PluginTagToContent("hparams")
    (content,) = data.values()
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in info.hparams.items()}


def test_tensorboard_hparams_of_every_run(runs, tb):
    out, _ = tb
    for sweep, d in sweeps(runs).items():
        r = kinds.load_result(d)
        for want in expected(d):
            hp = session_hparams(os.path.join(out, sweep, want["name"]))
            assert {k: hp[k] for k in want["grid"]} == pytest.approx(want["grid"], rel=1e-12)
            assert (hp["sweep"], hp["kind"], hp["algorithm"]) == (sweep, r.KIND, r.algorithm)
            assert set(hp) == set(want["grid"]) | {"sweep", "kind", "algorithm", "task"}
    acc = EventAccumulator(out, **SIZE).Reload()  # the experiment, in OUT itself
    exp = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/experiment"])
    names = {h.name for h in exp.experiment.hparam_infos}
    assert {"alpha", "beta", "seed", "sweep", "eta", "zeta"} <= names
    metrics = {m.name.tag for m in exp.experiment.metric_infos}
    assert {"final/auc", "final/auc_return", "final/reward_rate_all", "seed/score"} <= metrics


def test_tensorboard_command_lines(tb):
    out, stdout = tb
    lines = stdout.splitlines()
    assert lines[0] == f"wrote 3 TensorBoard runs of pred and 9 per-seed runs: {os.path.join(out, 'pred')}"
    assert len(lines) == 6 and lines[-1] == f"view: tensorboard --logdir {shlex.quote(out)}"


# ------------------------------------------------------------------ W&B, read back from its record files

def wandb_records(path: str) -> list:
    """The protobuf records of a W&B run file (.wandb): W&B's LevelDB-style log,
    a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of
    chunks (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1)
    pos, part, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            break
        part += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            out.append(pb.Record.FromString(part))
            part = b""
    return out


def read_wandb_run(run_dir: str) -> dict:
    """name, group, project, job type, config, history {tag: [(step, value)]}
    and summary of an offline run, from its .wandb file."""
    (f,) = [x for x in os.listdir(run_dir) if x.endswith(".wandb")]
    got = {"history": {}, "summary": {}}
    for rec in wandb_records(os.path.join(run_dir, f)):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            got.update(name=rec.run.display_name, group=rec.run.run_group, project=rec.run.project,
                       job_type=rec.run.job_type,
                       config={u.key: json.loads(u.value_json) for u in rec.run.config.update if u.key != "_wandb"})
        elif kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            for k, v in items.items():
                if not k.startswith("_"):
                    got["history"].setdefault(k, []).append((items["_step"], v))
        elif kind == "summary":
            got["summary"].update({(u.key or "/".join(u.nested_key)): json.loads(u.value_json)
                                   for u in rec.summary.update})
    return got


def test_wandb_offline_runs_match_curves_npz(runs, wb):
    out, stdout = wb
    run_dirs = json.load(open(os.path.join(out, export.MANIFEST)))["written"]
    got = {}
    for rel in run_dirs:
        g = read_wandb_run(os.path.join(out, rel))
        got[(g["group"], g["name"])] = g
    assert len(got) == len(run_dirs) == 13 * 4
    for sweep, d in sweeps(runs).items():
        r = kinds.load_result(d)
        for want in expected(d):
            g = got[(sweep, want["name"])]
            assert g["project"] == "tests" and g["job_type"] == ("seed" if "seed" in want["grid"] else "point")
            assert {k: g["config"][k] for k in want["grid"]} == pytest.approx(want["grid"], rel=1e-12)
            assert (g["config"]["sweep"], g["config"]["kind"], g["config"]["task"]) == (
                sweep, r.KIND, kinds.of_result(r).scores.task_of(r))
            assert set(g["history"]) == set(want["curves"])
            for tag, (x, y) in want["curves"].items():
                x, y = finite(x, y)
                steps, vals = zip(*g["history"][tag])
                assert list(steps) == x.tolist()
                np.testing.assert_allclose(vals, y, rtol=1e-6, err_msg=f"{sweep} {want['name']} {tag}")  # float64
            for tag, v in want["finals"].items():
                assert g["summary"][tag] == pytest.approx(v, rel=1e-9), tag
            assert not {t for t in g["summary"] if t.startswith(("final/", "seed/score"))} - set(want["finals"])
    assert stdout.splitlines()[-1] == f"upload: wandb sync {shlex.quote(out)}/wandb/offline-run-*"


# ------------------------------------------------------------------ bad input: one line, nothing written

def test_a_missing_extra_names_its_pip_install(runs, tmp_path, monkeypatch):
    for to, module, extra in (("tensorboard", "tensorboard.summary.writer.event_file_writer", "TensorBoard"),
                              ("wandb", "wandb", "Weights & Biases")):
        monkeypatch.setitem(sys.modules, module, None)  # the import fails, as without the extra
        rc, _, err = export_main([runs["ctl"], "--to", to, "--out", str(tmp_path / to)])
        assert rc == 2 and err.splitlines() == [
            f"bec-jax: error: export: --to {to} needs {extra}: pip install 'bec_jax[{to}]'"]
        assert not (tmp_path / to).exists()


@pytest.mark.parametrize("argv,message", [
    (["--to", "csv", "--out", "OUT"], "to: invalid choice: 'csv'"),
    (["--to", "wandb", "--project", "a/b", "--out", "OUT"],
     "project: a W&B project name of 1-128 characters without any of"),
    (["--to", "tensorboard"], "out: required"),
])
def test_bad_options_are_one_line(runs, tmp_path, argv, message):
    out = tmp_path / "o"
    rc, _, err = export_main([runs["ctl"], *(str(out) if a == "OUT" else a for a in argv)])
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("bec-jax: error: " + message), err
    assert not out.exists()


def test_a_folder_without_a_run_is_refused(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    rc, _, err = export_main([runs["ctl"], str(tmp_path / "empty"), "--to", "tensorboard", "--out",
                              str(tmp_path / "o")])
    assert rc == 2 and err == (f"bec-jax: error: dirs: {str(tmp_path / 'empty')!r} holds neither a run "
                               "(curves.npz) nor a study (study.json)\n")
    rc, _, err = export_main([runs["ctl"], runs["ctl"], "--to", "tensorboard", "--out", str(tmp_path / "o")])
    assert rc == 2 and "dirs: two runs would be exported as 'ctl'" in err and not (tmp_path / "o").exists()


def test_overwrite_replaces_only_what_an_export_wrote(runs, tmp_path):
    out = tmp_path / "o"
    argv = [runs["ctl"], "--to", "tensorboard", "--out", str(out)]
    assert export_main(argv)[0] == 0
    (out / "mine.txt").write_text("keep me")
    rc, _, err = export_main(argv)
    assert rc == 2 and err == (f"bec-jax: error: out: {str(out)!r} already exists and is not empty; choose "
                               "another directory or pass --overwrite\n")
    assert export_main(argv + ["--overwrite"])[0] == 0
    events = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.startswith("events.out")]
    assert len(events) == 1 + 2 and (out / "mine.txt").read_text() == "keep me"  # the experiment and 2 points
    assert sorted(json.load(open(out / export.MANIFEST))["written"]) == sorted(os.path.relpath(e, out)
                                                                             for e in events)


def test_one_study_alone_is_named_by_its_sweeps(runs, tmp_path):
    rc, stdout, _ = export_main([runs["study"], "--to", "tensorboard", "--out", str(tmp_path / "o")])
    assert rc == 0 and sorted(os.listdir(tmp_path / "o" / "first")) == [
        "alpha=0.01,beta=0.1", "alpha=0.01,beta=0.5", "alpha=0.05,beta=0.1", "alpha=0.05,beta=0.5"]
    assert stdout.startswith("wrote 4 TensorBoard runs of first: ")


def test_guide_commands_run_as_pasted(tmp_path, monkeypatch):
    """docs/export.md's blocks: a run, then both exports, as pasted; then its Python block."""
    monkeypatch.chdir(tmp_path)
    block = code("docs/export.md", "bash", containing="bec-jax export")
    lines = [shlex.split(x)[1:] for x in block.replace("\\\n", " ").splitlines() if x.startswith("bec-jax ")]
    assert [a[0] for a in lines] == ["run", "export", "export"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(lines[0]) == 0
    for argv in lines[1:]:
        rc, _, err = export_main(argv[1:])
        assert rc == 0, err
    assert len(EventAccumulator("tb/baird_td/alpha=0.01", **SIZE).Reload().Scalars("curves/rmscbe")) == 7
    assert len([d for d in os.listdir("wb/wandb") if d.startswith("offline-run-")]) == 2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the page's Python block, on the same run
        exec(compile(code("docs/export.md", "python"), "docs/export.md", "exec"), {})
    assert out.getvalue() == "['alpha=0.01', 'alpha=0.05', 'alpha=0.01/seed_0']\n"
    assert len(EventAccumulator("tb_from_python/baird_td/alpha=0.05/seed_2", **SIZE).Reload().Scalars(
        "seed/score")) == 1
