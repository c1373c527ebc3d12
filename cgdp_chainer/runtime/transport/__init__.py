"""How bytes move: shared-memory segments, the flat per-chunk buffers that
make copies, reductions and updates one call per chunk, and the transfers
between a replica's device and host memory (CUDA copy streams on GPUs).

Imports nothing else of the runtime.
"""
