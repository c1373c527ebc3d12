"""A discrete-event simulation of tasks with dependencies on resources.

Generic: it knows tasks, their dependencies, first-come-first-served
resources and shared (fluid, max-min fair) resources, nothing about
training. :mod:`cgdp_chainer.costmodel.simulate` builds the task graphs.
"""
import collections
import heapq
import math

# Relative tolerance of the fluid simulation's level comparisons.
_EPS = 1e-12


class Task(object):
    """One piece of work in the simulation.

    Attributes:
        kind (str): forward, backward, d2h, reduce_update, h2d, gather,
            add, update, broadcast (typical), addgrads, copyparams (CPU);
            multi-node: reduce, allreduce, update (CGDP), allreduce
            (ChainerMN).
        device (int or str): Replica index, ``'host'`` or ``'network'``.
        chunk (int or None): Chunk index (0 = input side).
        iteration (int): Iteration number.
        duration (float): Seconds of work at full speed.
        latency (float): Fixed seconds before the work starts (holds the
            exclusive resource, uses no bandwidth).
        exclusive (str or None): A first-come-first-served resource.
        demands (dict): Shared resource -> use per second at full speed.
        start, end (float): Filled in by :meth:`Simulation.run`.
    """

    __slots__ = ('index', 'kind', 'device', 'chunk', 'iteration', 'duration',
                 'latency', 'exclusive', 'demands', 'deps_left',
                 'dependents', 'start', 'end', 'remaining', 'speed')

    def __init__(self, index, kind, device, chunk, iteration, duration,
                 latency, exclusive, demands):
        self.index = index
        self.kind = kind
        self.device = device
        self.chunk = chunk
        self.iteration = iteration
        self.duration = max(0.0, float(duration))
        self.latency = max(0.0, float(latency))
        self.exclusive = exclusive
        self.demands = demands or {}
        self.deps_left = 0
        self.dependents = []
        self.start = None
        self.end = None
        self.remaining = 0.0
        self.speed = 1.0

    def __repr__(self):
        return 'Task({}, dev={}, chunk={}, it={}, {:.6g}-{:.6g})'.format(
            self.kind, self.device, self.chunk, self.iteration,
            self.start or 0.0, self.end or 0.0)


def fair_speeds(tasks, caps):
    """Max-min fair speeds (fractions of full speed) of running tasks.

    Progressive filling: every task's speed grows at the same pace until it
    reaches 1 or a shared resource it uses is full; tasks on a full
    resource keep their speed, the others go on growing.

    Args:
        tasks (list of Task): Running tasks; their ``speed`` is set.
        caps (dict): Resource -> capacity.
    """
    growing = []
    for task in tasks:
        if task.demands:
            growing.append(task)
        else:
            task.speed = 1.0
    if not growing:
        return
    residual = {}
    for task in growing:
        for resource in task.demands:
            residual[resource] = caps[resource]
    level = 0.0
    while growing:
        load = collections.defaultdict(float)
        for task in growing:
            for resource, use in task.demands.items():
                load[resource] += use
        step = 1.0 - level
        for resource, used in load.items():
            if used > 0:
                step = min(step, residual[resource] / used)
        step = max(step, 0.0)
        level += step
        for resource, used in load.items():
            residual[resource] -= used * step
        if level >= 1.0 - _EPS:
            for task in growing:
                task.speed = 1.0
            return
        full = {r for r, used in load.items()
                if used > 0 and residual[r] <= 1e-9 * caps[r]}
        still = []
        for task in growing:
            if any(r in full for r in task.demands):
                task.speed = level
            else:
                still.append(task)
        growing = still


class Simulation(object):
    """Discrete-event simulation of tasks with dependencies on resources.

    Args:
        caps (dict): Shared resource -> capacity (fluid, max-min fair).
        servers (dict): Exclusive resource -> number of servers.
    """

    def __init__(self, caps, servers=None):
        self.caps = dict(caps)
        self.servers = dict(servers or {})
        self.tasks = []

    def add(self, kind, device, chunk, iteration, duration, deps=(),
            latency=0.0, exclusive=None, demands=None):
        """Adds a task that starts once all of ``deps`` have ended.

        Returns:
            Task: The task.
        """
        for resource in (demands or {}):
            if resource not in self.caps:
                raise KeyError('unknown shared resource {!r}'.format(
                    resource))
        if exclusive is not None and exclusive not in self.servers:
            self.servers[exclusive] = 1
        task = Task(len(self.tasks), kind, device, chunk, iteration,
                    duration, latency, exclusive, demands)
        for dep in deps:
            if dep is None:
                continue
            task.deps_left += 1
            dep.dependents.append(task)
        self.tasks.append(task)
        return task

    def run(self):
        """Runs every task to its end.

        Returns:
            float: The time the last task ends.

        Raises:
            RuntimeError: Some tasks can never start (a dependency cycle).
        """
        run = _Run(self.tasks, self.servers, self.caps)
        while True:
            run.start_what_can_start()
            if not run.working and not run.in_latency:
                break
            run.advance_to_next_event()
        if run.finished != len(self.tasks):
            raise RuntimeError('{} of {} tasks never ran (a dependency '
                               'cycle)'.format(len(self.tasks) - run.finished,
                                               len(self.tasks)))
        return run.now


class _Run(object):
    """The state of one :meth:`Simulation.run`: the clock, the free servers
    and queues of the exclusive resources, and the tasks in their latency
    or working.

    Args:
        tasks (list of Task): Every task of the simulation.
        servers (dict): Exclusive resource -> number of servers.
        caps (dict): Shared resource -> capacity.
    """

    def __init__(self, tasks, servers, caps):
        self.caps = caps
        self.now = 0.0
        self.free = dict(servers)
        self.queues = {resource: [] for resource in servers}
        self.in_latency = []
        self.working = []
        self.newly_ready = [t for t in tasks if t.deps_left == 0]
        self.finished = 0

    def start_what_can_start(self):
        """Starts whatever can start now; zero-time tasks end at once and
        may make more tasks ready, hence the loop."""
        while True:
            progressed = self._start_ready()
            progressed = self._start_queued() or progressed
            progressed = self._finish_done() or progressed
            if not progressed:
                break

    def _start_ready(self):
        """Starts the newly ready tasks, or queues them for their exclusive
        resource; returns whether there were any."""
        progressed = False
        while self.newly_ready:
            task = self.newly_ready.pop()
            progressed = True
            if task.exclusive is None:
                self._start(task)
            else:
                heapq.heappush(self.queues[task.exclusive],
                               (self.now, task.index, task))
        return progressed

    def _start_queued(self):
        """Starts queued tasks on their free exclusive resources; returns
        whether any started."""
        progressed = False
        for resource, queue in self.queues.items():
            while queue and self.free[resource] > 0:
                _, _, task = heapq.heappop(queue)
                self.free[resource] -= 1
                progressed = True
                self._start(task)
        return progressed

    def _finish_done(self):
        """Ends the working tasks with no work left; returns whether any
        ended."""
        done_now = [t for t in self.working if t.remaining <= 0.0]
        if not done_now:
            return False
        self.working = [t for t in self.working if t.remaining > 0.0]
        for task in done_now:
            self._finish(task)
            self.finished += 1
        return True

    def _start(self, task):
        task.start = self.now
        if task.latency > 0:
            heapq.heappush(self.in_latency,
                           (self.now + task.latency, task.index, task))
        else:
            task.remaining = task.duration
            self.working.append(task)

    def _finish(self, task):
        task.end = self.now
        if task.exclusive is not None:
            self.free[task.exclusive] += 1
        for dependent in task.dependents:
            dependent.deps_left -= 1
            if dependent.deps_left == 0:
                self.newly_ready.append(dependent)

    def advance_to_next_event(self):
        """Moves the clock to the next end of a task's work or latency, at
        the working tasks' fair speeds.

        Raises:
            RuntimeError: No running task gets any capacity.
        """
        fair_speeds(self.working, self.caps)
        step = math.inf
        if self.in_latency:
            step = self.in_latency[0][0] - self.now
        for task in self.working:
            if task.speed > 0:
                step = min(step, task.remaining / task.speed)
        if step == math.inf:
            raise RuntimeError('simulation stalled: running tasks get no '
                               'capacity')
        step = max(step, 0.0)
        self.now += step
        for task in self.working:
            done_in = task.remaining / task.speed if task.speed > 0 \
                else math.inf
            if done_in <= step * (1 + 1e-9) + 1e-15:
                task.remaining = 0.0
            else:
                task.remaining -= task.speed * step
        while self.in_latency and self.in_latency[0][0] <= self.now + 1e-15:
            _, _, task = heapq.heappop(self.in_latency)
            task.remaining = task.duration
            self.working.append(task)
