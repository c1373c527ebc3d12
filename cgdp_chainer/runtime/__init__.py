"""What runs while training, in folders by role; arrows point down only.

The two front doors sit here: :mod:`.updater` (``CGDPUpdater``, which owns
the training loop) and :mod:`.multi_node_optimizer` (ChainerMN's optimizer
call, the user's process as the replica). Below them, each folder is one
role, and a folder imports only the folders listed after it:

- :mod:`.input`: the batch's way in (draw, read ahead, convert per share);
- :mod:`.chunks`: which layers form a chunk, the chunk-size search and
  the plan in use;
- :mod:`.workers`: where replicas run (threads or processes): starting,
  feeding, watching and stopping each replica's worker;
- :mod:`.replica`: what a replica is and does in one iteration (its device
  view, the readiness backward, observations, the loss's reduction and
  its evidence, random streams);
- :mod:`.host`: the master weights and what the host does with a chunk
  (reduce, update, publish; one host per node);
- :mod:`.transport`: shared memory, the flat per-chunk buffers and the
  copies between devices and the host.

Nothing here imports :mod:`cgdp_chainer.costmodel`, ``experiments`` or
``benchmarks`` (tests/test_layering.py checks both rules).
"""
