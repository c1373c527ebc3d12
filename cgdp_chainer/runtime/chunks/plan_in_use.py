"""The chunk plan the replicas train with, and what follows it.

The first iteration runs the whole model as one chunk; the plan formed
from its ready order (see :class:`~.chunk_choice.ChunkChoice`) and every
plan the chunk-size search moves to then names each chunk's parameters,
lays the flat buffers out in its layer order (once: later plans cut the
same layers), and travels to the replicas with their next job.
"""
import chainer

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.workers import worker as worker_module


class PlanInUse(object):
    """The plan in use, its chunks' names, and what the replicas must
    still be sent of it.

    Args:
        chunking (ChunkChoice): The chunking asked for.
        master (chainer.Link): The master model, whose parameters the
            plans cut (all of them one chunk at the first iteration).
    """

    def __init__(self, chunking, master):
        self.chunking = chunking
        self.plan = None          # the ChunkPlan once formed
        self._sent = False        # whether the replicas hold self.plan
        self.layout_unsent = None  # a flat layout the replicas must adopt
        self.chunk_names = worker_module.runtime_chunk_names(
            worker_module.whole_model_plan(
                [name for name, _ in master.namedparams()]))
        self._master = master
        self._replicas = None
        self._accumulator = None

    def attach(self, replicas, accumulator):
        """The replicas and the host accumulator whose flat buffers follow
        each new plan."""
        self._replicas = replicas
        self._accumulator = accumulator

    def describe(self):
        """The chunking in use in words (see ``ChunkChoice.describe``)."""
        return self.chunking.describe(
            None if self.plan is None else self.plan.n_chunks)

    def use(self, plan):
        """Makes ``plan`` the one in use, from the next job on."""
        if plan == self.plan:
            return
        self.plan = plan
        self._sent = False
        self.chunk_names = worker_module.runtime_chunk_names(plan)
        if self._accumulator is not None:
            self._follow_in_layout()
            self._accumulator.chunk_names = self.chunk_names

    def _follow_in_layout(self):
        """Lays the flat buffers out in the plan's layer order where a chunk
        is not one slice yet (once, after the first iteration: every later
        plan cuts the same layers), between iterations; the replicas follow
        with their next job."""
        master = self._replicas.master
        if all(master.layout.contiguous(names)
               for names in self.chunk_names):
            return
        layout = master.layout.reordered(buffers.layer_order(self.plan))
        self._replicas.relayout(layout)
        self._accumulator.relayout(layout)
        self.layout_unsent = layout

    def _named_params(self):
        return list(self._master.namedparams())

    def resize(self, size):
        """Moves to ``size`` layers per chunk, where it gives a new plan."""
        plan = self.chunking.resize(size, self._named_params())
        if plan is not None:
            self.use(plan)

    def settle(self, ready_orders, forming, seconds, allreducer):
        """Forms the plan after the first iteration, and moves the
        ``'auto'`` search on by this iteration's time.

        Args:
            ready_orders (list): Each replica's ready order.
            forming (bool): Whether this iteration forms the plan.
            seconds (float): The iteration's time.
            allreducer: The MPI ranks' all-reduce, or None.
        """
        if forming:
            self.use(self.chunking.form(ready_orders, self._named_params(),
                                        allreducer))
        if self.chunking.search is not None:
            # The size this iteration ran with; LogReport keeps the trail.
            chainer.report({'cgdp/chunk_size': self.chunking.chunk_size})
            # The first iteration runs one chunk to learn the ready order:
            # its time says nothing about the size being tried.
            if not self.chunking.settled and not forming:
                self.resize(self.chunking.searched(seconds, allreducer))

    def for_job(self, forming):
        """What the next jobs carry of the plan: ``(plan or None,
        fingerprint or None, layout or None)``, each sent once."""
        plan = None if forming or self._sent else self.plan
        self._sent = not forming
        layout, self.layout_unsent = self.layout_unsent, None
        return (plan, None if forming else self.plan.fingerprint, layout)
