"""One replica's side: where replicas run (worker processes or threads, and
the channels to them), one replica's iteration (forward, the readiness
backward that hands each chunk over as soon as it is final), how the
model is copied to a replica, how evaluation sees the first device, and
how the replicas' observations combine into the whole batch's, how the
loss's reduction is found at the first iteration, and the replicas' random
streams.

Imports :mod:`..host` (the accumulator a thread replica hands chunks to)
and :mod:`..transport`.
"""
