"""Bucket sizes: the few grid-chunk sizes programs are compiled for.

A program's shape includes its chunk's grid points, so a sweep with one more
step size would compile again from nothing. A chunk of a group smaller than
the planned chunk is padded to the next bucket size instead (`engine.plan.split`,
by repeating its last point: computed and discarded), so every grid of
sizes within one bucket runs the same program, from the process's cache or
the persistent one.
"""
from __future__ import annotations

FINE_ABOVE = 64  # past this many points, finer buckets: the padding would cost run time, not compile time


def bucket(n: int) -> int:
    """The smallest bucket size >= `n`. Up to `FINE_ABOVE` points: the powers
    of two and the midpoints 1.5 x 2^k between them (1, 2, 3, 4, 6, 8, 12,
    16, 24, 32, 48, 64), where a run is most often short and a compile saved
    matters most. Past it, eight to an octave: the multiples of 2^k / 16 in
    (2^k / 2, 2^k] (72, 80, ..., 128, 144, ..., 512, 576, 640, ...), where
    the run time the padding costs is what matters.

    Waste (padded points of the computed ones), worst case one point past an
    edge: up to 64 points, one past 2^k pads to 1.5 x 2^k, (0.5 x 2^k - 1) of
    1.5 x 2^k (under 1/3: 33 points run as 48, 15/48), and one past 1.5 x 2^k
    pads to 2^(k+1) (under 1/4); past 64 points, under 1/9 (513 points run as
    576, 63/576 = 11%). Powers of two alone would waste up to half."""
    n = max(int(n), 1)
    if n <= 3:
        return n
    p = 1 << (n - 1).bit_length()  # the power of two >= n
    if n > FINE_ABOVE:
        step = p // 16
        return -(-n // step) * step
    return p * 3 // 4 if n <= p * 3 // 4 else p
