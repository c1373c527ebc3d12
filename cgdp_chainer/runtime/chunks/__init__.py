"""Which layers form a chunk: the chunk options (layers per chunk or bytes
per chunk) turned into a plan from the order the backward makes gradients
ready, the run-time search for the chunk size, and the plan in use (what
the replicas must still be sent of it).

Used by the front doors; imports :mod:`..workers` (the chunk names a job
carries, the chooser's inputs on its device), :mod:`..replica` (the
readiness order) and :mod:`..transport` (the flat buffers' layer order).
"""
