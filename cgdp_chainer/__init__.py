"""CPU-GPU data parallel (CGDP) training for Chainer."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported
