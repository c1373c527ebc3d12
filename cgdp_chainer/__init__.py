"""CPU-GPU data parallel (CGDP) training for Chainer."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported
from cgdp_chainer.timeline import Timeline  # NOQA
from cgdp_chainer.runtime.updater import CGDPUpdater  # NOQA
