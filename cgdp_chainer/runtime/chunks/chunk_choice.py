"""The chunking a user asked for, and the plan it gives as it settles.

``chunk_size`` and ``chunk_bytes`` (see ``CGDPUpdater``) name either a
fixed chunking (layers per chunk, chunk boundaries, bytes per chunk) or one
that is chosen while training: ``'auto'`` (the run-time search, which times
iterations of doubling sizes), a named policy (``'model'``: the cost
model's chooser, registered from above the runtime) or a chooser callable.
:class:`ChunkChoice` holds which, forms the plan from the first backward's
ready order, and re-forms it whenever the size changes.
"""
import collections
import copy
import numbers

import chainer

from cgdp_chainer import log
from cgdp_chainer.runtime.chunks import chunk_search
from cgdp_chainer.runtime.chunks import chunking
from cgdp_chainer.runtime.workers import worker as worker_module


# The 'auto' search starts at the layer count that gives at most this many
# chunks, so that it stays within a few dozen iterations on deep networks
# (ResNet-152 has over 300 layers).
AUTO_SEARCH_MAX_CHUNKS = 64

# Named chunk-size policies that need more than the runtime: higher layers
# register them (the cost model registers 'model' in cgdp_chainer/__init__),
# so that the runtime never imports them. 'auto' is the runtime's own.
_CHUNK_SIZE_POLICIES = collections.OrderedDict()


def register_chunk_size_policy(name, make_chooser):
    """Makes ``chunk_size=name`` mean ``chunk_size=make_chooser()``.

    Args:
        name (str): The policy's name.
        make_chooser (callable): Returns a chooser (see ``CGDPUpdater``).
    """
    _CHUNK_SIZE_POLICIES[name] = make_chooser


def chunk_size_policies():
    """Names that ``chunk_size`` accepts as a string."""
    return ('auto',) + tuple(_CHUNK_SIZE_POLICIES)


class ChunkChoice(object):
    """The chunk options, checked, and the plan they give.

    Args:
        chunk_size: As ``CGDPUpdater``'s.
        chunk_bytes: As ``CGDPUpdater``'s.
        n_layers (int): Layers of the model.

    Attributes:
        chunk_size (int or None): Layers per chunk in use (None for
            boundaries or bytes).
        search (ChunkSizeSearch or None): The ``'auto'`` search.
        chooser (callable or None): A chooser still to be called before the
            first iteration.
    """

    def __init__(self, chunk_size, chunk_bytes, n_layers):
        self._n_layers = n_layers
        self.chunk_size = None
        self.search = None
        self.chooser = None
        self._ready = None  # the first iteration's BackwardReport
        kind, value = chunking.parse_chunking(
            chunk_size, chunk_bytes, n_layers, chunk_size_policies())
        if kind == 'policy' and value == 'auto':
            start = max(1, -(-n_layers // AUTO_SEARCH_MAX_CHUNKS))
            self.search = chunk_search.ChunkSizeSearch(n_layers, start=start)
            self._spec = self._size_spec(self.search.current_size)
        elif kind in ('policy', 'chooser'):
            self.chooser = _CHUNK_SIZE_POLICIES[value]() \
                if kind == 'policy' else value
            # The default chunks until it has chosen.
            self._spec = ('bytes', chunking.DEFAULT_CHUNK_BYTES)
        elif kind == 'size':
            self._spec = self._size_spec(value)
        else:
            self._spec = (kind, value)

    @property
    def settled(self):
        """False while ``chunk_size='auto'`` is still trying sizes."""
        return self.search is None or self.search.done

    def describe(self, n_chunks):
        """The chunking in words, e.g. ``'129 chunks of >= 1 MiB'``."""
        words = chunking.describe(self._spec, n_chunks)
        if self.search is not None:
            words += ' (auto search)'
        return words

    def _size_spec(self, size):
        self.chunk_size = size
        return ('size', min(size, self._n_layers))

    def plan_from(self, report, named_params):
        """The plan for one backward's ready order.

        Args:
            report (BackwardReport): The ready order.
            named_params: The master's ``namedparams()``.
        """
        return chunking.plan_from(self._spec, report, named_params,
                                  self._n_layers)

    def form(self, reports, named_params, allreducer):
        """The plan from the first iteration's ready orders, checked to be
        the same on every replica and every MPI rank.

        Args:
            reports (list of BackwardReport): Each replica's.
            named_params (list): The master's ``namedparams()``.
            allreducer: The ranks' allreducer, or None.
        """
        # A replica whose loss reached no parameter (a constant without a
        # graph, as SSD's loss on a share without a positive box) saw no
        # ready order: its gradients are zeros whatever the chunks, and
        # the others' order forms the plan (another rank's, where no
        # replica of this one reached a parameter).
        reached = [report for report in reports
                   if chunking.reaches_parameters(report)] or reports[:1]
        reached[0] = chunking.ready_order_of_the_ranks(
            reached[0], [name for name, _ in named_params], allreducer)
        plans = [self.plan_from(report, named_params) for report in reached]
        plans[0].check_same([p.fingerprint for p in plans], what='replica')
        chunking.check_same_on_every_rank(plans[0], allreducer)
        self._ready = reached[0]
        return plans[0]

    def resize(self, size, named_params):
        """Uses ``size`` layers per chunk; returns the plan it gives, or
        None before the first iteration's ready order is known."""
        self._spec = self._size_spec(size)
        if self._ready is None:
            return None
        return self.plan_from(self._ready, named_params)

    def ask_chooser(self, master, device, sample_inputs, n_devices,
                    loss_func, host_threads, workers, optimizer, allreducer):
        """Calls the chooser once, on a copy of ``master`` on the first
        replica's ``device`` (see ``CGDPUpdater``'s ``chunk_size``).

        Args:
            master (chainer.Link): The master model (left as it is).
            sample_inputs: A converted share of the first batch, in host
                memory.
            optimizer: The optimizer CGDP runs on the host.
            allreducer: The ranks' all-reduce, or None.
            n_devices, loss_func, host_threads, workers: As the chooser
                takes them.

        Returns:
            int: Layers per chunk (see :meth:`chosen`).
        """
        replica = copy.deepcopy(master)
        replica.to_device(device)
        # The profile runs the replica's loss, which reports to its own
        # observers; a private reporter keeps that out of the Trainer's.
        reporter = chainer.Reporter()
        reporter.add_observer('main', replica)
        reporter.add_observers('main', replica.namedlinks(skipself=True))
        with reporter.scope({}):
            size = self.chooser(
                replica, device,
                worker_module.send_inputs(device, sample_inputs),
                n_devices, loss_func, host_threads, workers,
                optimizer=optimizer)
        return self.chosen(size, allreducer)

    def chosen(self, size, allreducer):
        """Checks a chooser's answer and makes every rank use rank 0's;
        the chooser is spent.

        Returns:
            int: Layers per chunk.
        """
        if isinstance(size, bool) or not isinstance(
                size, numbers.Integral) or size < 1:
            raise ValueError(
                'the chunk-size chooser returned {!r}; it must return a '
                'positive int (layers per chunk)'.format(size))
        if allreducer is not None:
            # Ranks profile separately; all must cut the model alike.
            size = allreducer.allreduce_int(
                size if allreducer.rank == 0 else 0, op='max')
        self.chooser = None
        return int(size)

    def searched(self, seconds, allreducer):
        """Records an iteration's seconds in the ``'auto'`` search.

        Returns:
            int: The size to try next (the best one once done).
        """
        if allreducer is not None:
            # Every rank must pick the same size: judge by the slowest.
            seconds = allreducer.allreduce_scalar(seconds, op='max')
        self.search.record(seconds)
        if self.search.done:
            log.info('CGDP chunk-size search: chose {}'.format(
                self.search.best), '(size, seconds) {}'.format(
                    self.search.history))
        return self.search.current_size
