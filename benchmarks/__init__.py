"""Benchmarks of bec_jax: the NumPy-loop baseline, throughput on the standard
workload, and scaling (throughput, memory, compile time). See benchmarks/README.md."""
