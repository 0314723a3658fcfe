"""The sweep engine, one job per module (bottom to top):

    protocol    the interface a front implements (Engine), and what fronts share:
                the float64 guard, chunk rounding, gather, the meta record
    layout      which state leaves are batched; the seed-major axis order
    streams     each seed's random stream (keys, block uniforms, its transitions)
    seed_stats  bit-exact statistics over seeds, in the program and on the host
    tuning      compiler options, the program's run-fast form, the executable cache
    plan        groups of grid points, chunks, a chunk's grid input
    kernel      the traced pieces of one group's program (setup, start, blocks, finish)
    programs    the kernel compiled: whole-run, joint and segment programs, meshes
    execute     running chunks: placement, segments, progress, checkpoints

The prediction front (`bec_jax.prediction.sweep`: `run`, `run_many`, `assemble`) and the
control front (`bec_jax.control.sweep`) sit above it, each an `Engine`; a spec
names its front (`spec.engine`). Importing this package imports none of its
modules.
"""
