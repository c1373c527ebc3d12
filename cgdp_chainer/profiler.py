"""Moved to :mod:`cgdp_chainer.costmodel.profiler`; this name stays until
``experiments.profile`` imports it from there."""
from cgdp_chainer.costmodel.profiler import *  # NOQA
from cgdp_chainer.costmodel.profiler import (  # NOQA
    DEFAULT_REPS, STATISTICS, profile_model, profile_replica, save_profile)
