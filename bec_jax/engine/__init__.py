"""The sweep engine, one job per module (bottom to top):

    protocol    the interface a front implements (Engine), and what fronts share:
                the float64 guard, chunk rounding, gather, the meta record
    layout      which state leaves are batched; the seed-major axis order
    streams     each seed's random stream (its key, its block uniforms)
    seed_stats  bit-exact statistics over seeds, in the program and on the host
    tuning      compiler options, the program's run-fast form, the executable cache
    plan        groups of grid points and their chunks, padding
    programs    the program record, jit over the grid, meshes, segment programs
    execute     running chunks: placement, segments, progress, checkpoints
    joint       several sweeps of one front in one program (run_many)

The fronts (the prediction sweep's, the control sweep's) sit above it, each
an `Engine`, and hand the engine their programs, sizes and hooks through that
protocol; the engine imports no front. Importing this package imports none of
its modules.
"""
