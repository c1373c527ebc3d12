"""Summing the replicas' gradient slots on the host, in cache-sized blocks.

Used by the host accumulator and by the host update's benchmark helper, so
that neither needs the other.
"""
import numpy


# Elements per block of the reduction: the partial sum of a block stays in
# the core's cache while the device slots stream past it once, so the sum
# reads each slot once and writes the result once.
REDUCE_BLOCK = 1 << 15


def reduce_sum(out, slots, scale=None):
    """``out[...] = scale * sum(slots)``, in cache-sized blocks.

    Args:
        out (numpy.ndarray): Destination (C-contiguous).
        slots (list of numpy.ndarray): Arrays of ``out``'s shape.
        scale (float or None): Factor applied to the sum, if any.
    """
    flat_out = out.reshape(-1)
    flats = [s.reshape(-1) for s in slots]
    factor = None if scale is None or scale == 1.0 else out.dtype.type(scale)
    for begin in range(0, flat_out.size, REDUCE_BLOCK):
        block = slice(begin, begin + REDUCE_BLOCK)
        o = flat_out[block]
        if len(flats) == 1:
            numpy.copyto(o, flats[0][block])
        else:
            numpy.add(flats[0][block], flats[1][block], out=o)
            for flat in flats[2:]:
                numpy.add(o, flat[block], out=o)
        if factor is not None:
            o *= factor


def reduce_weighted(out, slots, weights):
    """``out[...] = sum(w * slot)`` for devices with unequal shares."""
    numpy.multiply(slots[0], out.dtype.type(weights[0]), out=out)
    for slot, weight in zip(slots[1:], weights[1:]):
        out += out.dtype.type(weight) * slot
