"""The host's side: the master weights (the user's model as the truth
between iterations), and per chunk the reduction over the replicas, the
optimizer's update (fused kernels) and the publication of the new weights;
one host per node shared by its ranks for the optimizer form.

Imports :mod:`..transport` only.
"""
