"""The four reference networks of the CGDP paper, as stage sequences."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported
