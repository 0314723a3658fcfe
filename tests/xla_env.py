"""Subprocess environments whose XLA flags add to the caller's instead of replacing them.

A test that needs four fake CPU devices in a subprocess must keep the flags the
suite runs under: `XLA_FLAGS=--xla_cpu_max_isa=AVX2 pytest` checks the suite on
AVX2 code, and a subprocess that replaced XLA_FLAGS would quietly run AVX-512
code again.

A device count makes host (CPU) devices, so a subprocess given one runs on JAX's
CPU backend (JAX_PLATFORMS=cpu) on a machine with a GPU too: a test of four
fake CPU devices stays one on a GPU machine.
"""
import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def xla_flags(env=None, *, devices: int | None = None, cpu: bool | None = None) -> dict:
    """A copy of `env` (default: os.environ) whose XLA_FLAGS keep every flag but a
    device count, with `--xla_force_host_platform_device_count=devices` added when
    `devices` is given (left out, the subprocess sees its machine's devices).
    `cpu`: the subprocess runs on JAX's CPU backend (JAX_PLATFORMS=cpu) whatever
    the machine has; default: when `devices` is given. Pass cpu=False where the
    subprocess's results are compared with this process's, which runs on the
    default backend (a GPU where there is one)."""
    env = dict(os.environ if env is None else env)
    if cpu if cpu is not None else devices is not None:
        env["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    if devices is not None:
        flags.append(f"{DEVICE_COUNT_FLAG}={devices}")
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env
