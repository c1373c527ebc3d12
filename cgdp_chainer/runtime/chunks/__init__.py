"""Which layers form a chunk: the chunk options (layers per chunk or bytes
per chunk) turned into a plan from the order the backward makes gradients
ready, and the run-time search for the chunk size.

Used by the front doors; imports :mod:`..replica` (the readiness order).
"""
