"""Sweep results: the arrays a sweep reports, best-point choice, sensitivity,
the summary records, and save/load (`curves.npz` + a JSON sidecar).

Shapes: G grid points, N seeds, L logged points (step 0 included), M metrics.
Statistics across seeds are taken over the seeds that have not diverged.

Divergence convention: the error of a diverged run is unbounded, so it is +inf,
never NaN. Where every seed of a grid point has diverged, the point's mean, std
and sem are +inf from that logged step on, and a diverged seed's `final` value is
+inf. JSON has no infinity: `summary.json` writes null there (`final_mean` and
`final_std` null when every seed diverged, `auc` null when any did). A NaN in a
saved statistic therefore never means "diverged"; `sweep.run` warns if one appears.

Interrupted sweeps: `ChunkStore` keeps each finished chunk of a running sweep in
DIR/chunks/ (one `chunk_00003.npz` per chunk, written atomically, plus a manifest
with the spec and chunk size), so `bec-jax run --resume` can skip them.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np

from bec_jax.spec import STEP_NAMES, SweepSpec

CURVES_FILE = "curves.npz"
SUMMARY_FILE = "summary.json"
META_FILE = "meta.json"


@dataclass
class SweepResult:
    """Everything one sweep reports.

    Attributes:
      spec: the `SweepSpec` that produced it.
      steps: (L,) the step of each logged point (0, log_every, ..., steps).
      alpha, beta, zeta: (G,) the grid, NaN for step sizes the algorithm does not use.
      mean, std, sem: (M, G, L) mean, standard deviation (ddof=0) and standard
        error (ddof=1) across surviving seeds; +inf where no seed survives
        (alive == 0), never NaN.
      alive: (G, L) number of seeds not yet diverged at each logged point.
      final: (M, G, N) per-seed final metric values, +inf for diverged seeds.
      diverged_step: (G, N) when a seed's parameters stopped being finite or
        passed the divergence bound: the last step of the log block in which it
        happened (so a multiple of `log_every`; the state is frozen at the
        block's start from then on); -1 if never.
      meta: timings, versions and device, as recorded by the run.
    """

    spec: SweepSpec
    steps: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    zeta: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    sem: np.ndarray
    alive: np.ndarray
    final: np.ndarray
    diverged_step: np.ndarray
    meta: dict = field(default_factory=dict)

    # -- views -------------------------------------------------------------------
    @property
    def metrics(self) -> tuple:
        return self.spec.metrics

    @property
    def num_points(self) -> int:
        return int(self.alpha.shape[0])

    def _m(self, metric: str | None) -> int:
        if metric is None:
            return 0
        if metric not in self.metrics:
            raise ValueError(f"metric: {metric!r} was not computed; available: {', '.join(self.metrics)}")
        return self.metrics.index(metric)

    def curve(self, point: int, metric: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) learning curve of one grid point."""
        m = self._m(metric)
        return self.mean[m, point], self.std[m, point]

    def point(self, i: int) -> dict:
        """The step sizes of grid point i (None where unused)."""
        return {n: (None if np.isnan(v[i]) else float(v[i]))
                for n, v in zip(STEP_NAMES, (self.alpha, self.beta, self.zeta))}

    @property
    def diverged_fraction(self) -> np.ndarray:
        """(G,) fraction of seeds that diverged by the last step."""
        return (self.diverged_step >= 0).mean(axis=1)

    def auc(self, metric: str | None = None) -> np.ndarray:
        """(G,) area under the mean error curve, as the mean over logged points
        (step 0 included); +inf where any seed diverged."""
        a = self.mean[self._m(metric)].mean(axis=1)
        return np.where(self.diverged_fraction > 0, np.inf, a)

    def best_index(self, metric: str | None = None) -> int:
        """The grid point with the lowest AUC among those with no diverged seed
        (the gradient-TD literature's convention); ties go to the lowest index.
        If every point has a diverged seed: the lowest diverged fraction, then the
        lowest AUC over surviving seeds."""
        auc = self.auc(metric)
        if np.isfinite(auc).any():
            return int(np.argmin(auc))  # argmin returns the first minimum
        raw = np.nan_to_num(self.mean[self._m(metric)].mean(axis=1), nan=np.inf)
        order = np.lexsort((np.arange(self.num_points), raw, self.diverged_fraction))
        return int(order[0])

    def final_mean(self, metric: str | None = None) -> np.ndarray:
        """(G,) mean metric at the last logged step over surviving seeds (+inf if none)."""
        return self.mean[self._m(metric), :, -1]

    def sensitivity(self, over: str = "alpha", *, stat: str = "final", metric: str | None = None,
                    fixed: dict | None = None) -> dict:
        """Error against one step size, for sensitivity plots.

        Args:
          over: the step size on the x-axis.
          stat: "final" (mean error at the last step) or "auc" (mean over the run).
          fixed: optional {name: value} restricting the other step sizes. Without
            it, for each x value the best over the other step sizes is taken.

        Returns a dict with "x" (sorted values), "y" (error; +inf where every seed
        diverged), "diverged" (fraction of seeds diverged at the chosen point)
        and "index" (the grid point used for each x).
        """
        if over not in STEP_NAMES or np.isnan(getattr(self, over)).all():
            raise ValueError(f"over: {over!r} is not a step size of this sweep")
        if stat not in ("final", "auc"):
            raise ValueError(f"stat: must be 'final' or 'auc', got {stat!r}")
        m = self._m(metric)
        vals = self.mean[m, :, -1] if stat == "final" else self.mean[m].mean(axis=1)
        mask = np.ones(self.num_points, bool)
        for n, v in (fixed or {}).items():
            if n not in STEP_NAMES:
                raise ValueError(f"fixed: unknown step size {n!r}; known: {', '.join(STEP_NAMES)}")
            mask &= np.isclose(getattr(self, n), v)
        xs = getattr(self, over)
        out = {"x": [], "y": [], "diverged": [], "index": []}
        for x in np.unique(xs[mask]):
            idx = np.flatnonzero(mask & (xs == x))
            # Prefer points without divergence, then lower error.
            key = np.lexsort((np.nan_to_num(vals[idx], nan=np.inf), self.diverged_fraction[idx]))
            i = int(idx[key[0]])
            out["x"].append(float(x))
            out["y"].append(float(vals[i]))
            out["diverged"].append(float(self.diverged_fraction[i]))
            out["index"].append(i)
        return {k: np.asarray(v) for k, v in out.items()}

    def summary(self, metric: str | None = None) -> list[dict]:
        """One record per grid point: env, algorithm, alpha, beta, zeta (None where
        unused), final_mean, final_std (None, null in JSON, when every seed
        diverged: the error is unbounded), auc (None when any seed diverged) and
        diverged_fraction."""
        m = self._m(metric)
        auc = self.auc(metric)
        recs = []
        for i in range(self.num_points):
            fm, fs = self.mean[m, i, -1], self.std[m, i, -1]
            recs.append({
                "env": self.spec.env,
                "algorithm": self.spec.algorithm,
                **self.point(i),
                "final_mean": None if not np.isfinite(fm) else float(fm),
                "final_std": None if not np.isfinite(fs) else float(fs),
                "auc": None if not np.isfinite(auc[i]) else float(auc[i]),
                "diverged_fraction": float(self.diverged_fraction[i]),
            })
        return recs

    # -- persistence -------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays written to `curves.npz`: `steps` (L,), `mean`/`std`/`sem`
        (G, L) for the first metric, the same per metric as `mean_<metric>` etc.,
        the grid, `alive`, `final` and `diverged_step`."""
        out = {"steps": self.steps, "alpha": self.alpha, "beta": self.beta, "zeta": self.zeta,
               "mean": self.mean[0], "std": self.std[0], "sem": self.sem[0],
               "alive": self.alive, "diverged_step": self.diverged_step}
        for i, name in enumerate(self.metrics):
            out[f"mean_{name}"] = self.mean[i]
            out[f"std_{name}"] = self.std[i]
            out[f"sem_{name}"] = self.sem[i]
            out[f"final_{name}"] = self.final[i]
        return out

    def save(self, out_dir: str) -> None:
        """Writes `curves.npz`, `summary.json` and `meta.json` (spec, versions,
        device, timings) into `out_dir`, each atomically (temporary file + rename).
        The JSON files are strict JSON: a non-finite number is written as null."""
        os.makedirs(out_dir, exist_ok=True)
        atomic_write(os.path.join(out_dir, CURVES_FILE), lambda f: np.savez(f, **self.arrays()), binary=True)
        write_json(os.path.join(out_dir, SUMMARY_FILE), self.summary())
        write_json(os.path.join(out_dir, META_FILE), dict(self.meta, spec=self.spec.to_dict()))

    @classmethod
    def load(cls, out_dir: str) -> "SweepResult":
        """Reads a result written by `save`."""
        with open(os.path.join(out_dir, META_FILE)) as f:
            meta = json.load(f)
        spec = SweepSpec.from_dict(meta.pop("spec"))
        with np.load(os.path.join(out_dir, CURVES_FILE)) as z:
            stack = lambda pre: np.stack([z[f"{pre}_{m}"] for m in spec.metrics])
            return cls(spec=spec, steps=z["steps"], alpha=z["alpha"], beta=z["beta"], zeta=z["zeta"],
                       mean=stack("mean"), std=stack("std"), sem=stack("sem"), alive=z["alive"],
                       final=stack("final"), diverged_step=z["diverged_step"], meta=meta)


TMP_PREFIX = ".tmp-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write, binary: bool = False) -> None:
    """Calls `write(f)` on a temporary file in the same directory, flushes it to
    disk, then renames it over `path`: a reader (or a run interrupted at any
    moment) sees the old file or the new one, never half of one. The file gets the
    usual permissions (0666 less the umask), not mkstemp's 0600."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=TMP_PREFIX, suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise



def json_ready(obj):
    """`obj` with every non-finite float (and numpy scalar) replaced by a JSON
    value: +-inf and NaN become None (JSON has no infinity)."""
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_json(path: str, obj) -> None:
    """Writes `obj` as strict JSON (non-finite floats as null), atomically."""
    atomic_write(path, lambda f: json.dump(json_ready(obj), f, indent=1, allow_nan=False))


# --------------------------------------------------------------- interrupted runs

CHUNKS_DIR = "chunks"
MANIFEST_FILE = "manifest.json"


class ChunkStore:
    """The finished chunks of a sweep, kept on disk while it runs so an
    interrupted run can resume: `DIR/chunks/manifest.json` (the spec, the chunk
    size, the device count and the number of chunks) and one
    `DIR/chunks/chunk_00003.npz` per finished chunk (the program's outputs for
    that chunk's grid points), each written atomically. A chunk file is there
    complete or not at all."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.dir = os.path.join(out_dir, CHUNKS_DIR)
        self.manifest_path = os.path.join(self.dir, MANIFEST_FILE)

    def exists(self) -> bool:
        return os.path.isfile(self.manifest_path)

    def chunk_path(self, index: int) -> str:
        return os.path.join(self.dir, f"chunk_{index:05d}.npz")

    def read_manifest(self) -> dict:
        try:
            with open(self.manifest_path) as f:
                m = json.load(f)
            m["spec"] = SweepSpec.from_dict(m["spec"])
            for k in ("chunk_size", "num_chunks", "num_devices"):
                if not isinstance(m.get(k), int) or isinstance(m.get(k), bool):
                    raise ValueError(f"bad {k}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"resume: cannot read {self.manifest_path!r} ({e}); "
                             "start over with --overwrite") from None
        return m

    def start(self, spec: SweepSpec, chunk_size: int, num_chunks: int, num_devices: int,
              backend: str) -> None:
        """Begins a fresh run: removes any earlier chunks and writes the manifest."""
        self.remove()
        os.makedirs(self.dir)
        write_json(self.manifest_path, {
            "spec": spec.to_dict(), "chunk_size": chunk_size, "num_chunks": num_chunks,
            "num_devices": num_devices, "backend": backend})

    def check(self, spec: SweepSpec, chunk_size: int | None = None) -> dict:
        """The manifest of the run to resume; `ValueError` naming the first field in
        which `spec` (or an explicit `chunk_size`) differs from it."""
        m = self.read_manifest()
        old, new = m["spec"].to_dict(), spec.to_dict()
        for k in old:
            if old[k] != new[k]:
                raise ValueError(f"{k}: differs from the interrupted run in {self.out_dir!r} "
                                 f"({old[k]!r} there, {new[k]!r} here); resume with the same spec "
                                 "or start over with --overwrite")
        if chunk_size is not None and chunk_size != m["chunk_size"]:
            raise ValueError(f"chunk_size: the interrupted run used {m['chunk_size']}, got {chunk_size}; "
                             "resume with the same chunk size (or leave --chunk-size out)")
        return m

    def save(self, index: int, arrays: dict) -> None:
        atomic_write(self.chunk_path(index), lambda f: np.savez(f, **arrays), binary=True)

    def load_done(self) -> dict[int, dict]:
        """{index: arrays} of the finished chunks. Leftover temporary files of a
        write that was cut short are removed; an unreadable chunk file is skipped
        (that chunk runs again)."""
        done = {}
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.startswith(TMP_PREFIX):
                os.unlink(path)
                continue
            if not (name.startswith("chunk_") and name.endswith(".npz")):
                continue
            try:
                index = int(name[len("chunk_"):-len(".npz")])
                with np.load(path) as z:
                    done[index] = {k: z[k] for k in z.files}
            except (OSError, ValueError, KeyError):
                continue
        return done

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
