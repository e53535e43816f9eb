"""CPU and GPU scheduling: how many threads llama.cpp computes with (and how they follow a
busy machine), the cgroup the process shares its CPUs in, and how the CPU waits for the GPU.
"""
