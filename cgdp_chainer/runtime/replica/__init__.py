"""What a replica is and does: its device and its view of the model, one
iteration's readiness backward that hands each chunk over as soon as it is
final, how evaluation sees the first device, how the replicas'
observations combine into the whole batch's (:mod:`.observations`), how
the loss's reduction is found (:mod:`.loss_reduction`, from the evidence
that :mod:`.reduction_evidence` weighs and words), and the replicas'
random streams.

Where a replica runs (threads or processes) is :mod:`..workers`' job.
Imports :mod:`..host` and :mod:`..transport`.
"""
