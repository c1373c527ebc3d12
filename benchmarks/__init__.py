"""Stand-alone timing scripts (run as ``python -m benchmarks.NAME``)."""

# The timed models' losses are Classifier's softmax cross entropy, a mean
# over the examples: given rather than found, so that no timed iteration
# pays for the checks that confirm a found reduction on the first batches
# (docs/USAGE.md), which the updaters CGDP is compared with do not make.
TIMED_REDUCTION = 'mean'
