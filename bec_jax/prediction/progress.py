"""A prediction sweep's progress bar, advanced by its programs' host callback
every few log blocks (`prediction.kernel`'s `on_block`): the front's
`Progress` (`engine.protocol.Engine`), which `engine.execute.run_chunks`
builds for a run that shows one.
"""
from __future__ import annotations

import sys
import threading

from bec_jax.prediction.spec import SweepSpec


class BlockProgress:
    """A progress bar (tqdm) in steps over the chunks a run computes, advanced by
    a host callback every few log blocks (see `make_program`); shown once the
    run has taken 2 s."""

    def __init__(self, spec: SweepSpec, chunks_todo: int, chunks_total: int, local_shards: int,
                 show: bool = True):
        from tqdm.auto import tqdm
        self.steps, self.K, self.shards = spec.steps, spec.log_every, max(1, local_shards)
        self.total_chunks = chunks_total
        self.bar = tqdm(total=chunks_todo * spec.steps, unit="step", unit_scale=True, delay=2.0, file=sys.stderr,
                        desc="[bec-jax]", dynamic_ncols=True, leave=True, disable=not show)
        self._ticks, self._last = 0, 0
        self._lock = threading.Lock()

    def chunk(self, i: int) -> None:
        """Names the chunk now running."""
        self.bar.set_description(f"[bec-jax] chunk {i + 1}/{self.total_chunks}", refresh=False)
        self._last = 0

    def __call__(self, j) -> None:
        """Block j (1-based) of the running chunk has finished on one device."""
        with self._lock:  # one call per device shard
            self._ticks += 1
            if self._ticks % self.shards == 0:
                step = int(j) * self.K
                self.bar.update(step - self._last)
                self._last = step

    def end_chunk(self) -> None:
        """The chunk is done: the bar moves to its end (the blocks after the last report)."""
        with self._lock:
            self.bar.update(self.steps - self._last)
            self._last = self.steps

    def close(self) -> None:
        """Closes the bar."""
        self.bar.close()
