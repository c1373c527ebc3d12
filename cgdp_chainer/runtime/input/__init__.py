"""The batch's way in: each iteration's examples drawn from the iterators,
split over the replicas and converted share by share, the next batch read
ahead while an iteration computes where the iterator allows it.

Used by the front doors; imports :mod:`..transport` only.
"""
