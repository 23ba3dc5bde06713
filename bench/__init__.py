"""pytest-benchmark benchmarks: the GPU tier (-m gpu) and the CPU tier (-m cpu); see harness.py."""
