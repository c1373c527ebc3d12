"""CPU-GPU data parallel (CGDP) training for Chainer."""
from cgdp_chainer import _compat  # NOQA: must run before Chainer is imported
from cgdp_chainer.timeline import Timeline  # NOQA
from cgdp_chainer.runtime.updater import CGDPUpdater  # NOQA
from cgdp_chainer.runtime.multi_node_optimizer import (  # NOQA
    create_multi_node_optimizer)
from cgdp_chainer.runtime.chunks import chunk_choice as _chunk_choice


def _model_chunk_chooser():
    # The cost model sits above the runtime: it is imported only when a
    # user asks for chunk_size='model'.
    from cgdp_chainer import costmodel
    return costmodel.ModelChunkChooser()


_chunk_choice.register_chunk_size_policy('model', _model_chunk_chooser)
