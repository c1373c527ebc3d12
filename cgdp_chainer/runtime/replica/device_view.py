"""The user's model as seen from the first device, for evaluation.

Scripts written for ``ParallelUpdater`` evaluate with
``extensions.Evaluator(test_iter, model, device=devices[0])``: the batches
go to device 0, where ``ParallelUpdater`` keeps the main model. CGDP keeps
the model (the master) in host memory, so :class:`DeviceView`, a
``chainer.LinkHook`` on the master, runs such a call on device 0: while the
master is called with inputs on that device, its parameters and persistent
values are device copies, refreshed only when the master changed since
the last such call (a new iteration, an array replaced), so training pays
nothing for it and an evaluation one host-to-device copy of the weights.
Outside those calls the master is what it always is; the updater's own
calls (with host inputs) never trigger it. Its gradients stay on the host,
untouched, even those Chainer will not yet let anyone read (a lazy
parameter's before its first forward, as an Evaluator called before
training meets them); a lazy parameter that such a call initializes is
initialized on the device, as the replaced updater's model would be, and
comes to the host with its weights.

Copies of the master (``copy.deepcopy``, pickling: the thread and process
replicas, a user's copy) get an inert hook.
"""
import chainer


class DeviceView(chainer.LinkHook):
    """Runs the master's forward on ``device`` when its inputs are there.

    Args:
        master (chainer.Link): The model in host memory (the master).
        device (chainer.backend.Device): Where a call's inputs make it run.
        version (callable): ``version()`` changes whenever training changed
            the master (the updater's iteration); with the identity of each
            parameter's array, it decides when the device copy is stale.
    """

    name = 'cgdp_device_view'

    def __init__(self, master, device, version):
        self._master = master
        self._device = device
        self._version = version
        self._host = chainer.get_device('@numpy')
        self._stamp = None
        self._params = {}  # path -> device array
        self._persistents = {}  # (link path, name) -> device value
        self._saved = None  # while swapped: what to put back
        self.refreshes = 0  # how often the weights were copied over

    # -- copies of the master are inert --------------------------------

    def __deepcopy__(self, memo):
        return _inert()

    def __reduce__(self):
        return (_inert, ())

    # -- the hook -------------------------------------------------------

    def install(self):
        """Hooks the master (replacing the view of an earlier updater)."""
        if self.name in self._master.local_link_hooks:
            self._master.delete_hook(self.name)
        self._master.add_hook(self)

    def uninstall(self):
        """Puts the host arrays back and leaves the master."""
        self.restore()
        if self._master.local_link_hooks.get(self.name) is self:
            self._master.delete_hook(self.name)
        self._params = {}
        self._persistents = {}

    def forward_preprocess(self, args):
        if self._master is None or args.link is not self._master:
            return
        self.restore()  # a forward that raised left the copies in
        if not _on_device((args.args, args.kwargs), self._device):
            return
        stamp = self._current_stamp()
        if stamp != self._stamp:
            self._refresh()
            self._stamp = stamp
        self._swap_in()

    def forward_postprocess(self, args):
        if self._master is not None and args.link is self._master:
            self.restore()

    def invalidate(self):
        """Makes the next call copy the weights again (after the master
        was restored from a snapshot, for instance)."""
        self._stamp = None

    def restore(self):
        """Gives the master its host arrays back, if they are swapped."""
        if self._saved is None:
            return
        params, persistents = self._saved
        self._saved = None
        links = dict(self._master.namedlinks())
        for (path, name), value in persistents.items():
            setattr(links[path], name, value)
        for param, array, _ in params:
            # (A parameter still uninitialized then, and initialized by
            # the forward, is moved to the host by to_device below.)
            if array is not None:
                param.array = array
        # Links and parameters say they are on the host again (no copy:
        # every array is there).
        self._master.to_device(self._host)
        for param, array, grad_var in params:
            # A parameter the forward initialized keeps the gradient its
            # initialization gave (moved to the host above), as a plain
            # model's would; one still uninitialized had none to take.
            if array is not None:
                param.grad_var = grad_var

    # -- the copies -----------------------------------------------------

    def _current_stamp(self):
        return (self._version(), tuple(
            id(param.array) for _, param in self._master.namedparams()))

    def _refresh(self):
        self._params = {
            path: None if param.array is None else self._copy(param.array)
            for path, param in self._master.namedparams()}
        self._persistents = {}
        for path, link in self._master.namedlinks():
            for name in link._persistent:
                value = link.__dict__[name]
                if isinstance(value, chainer.get_array_types()):
                    value = self._copy(value)
                self._persistents[(path, name)] = value
        self.refreshes += 1

    def _copy(self, array):
        """``array`` on the view's device, never the host array itself."""
        copied = self._device.send(array)
        return copied.copy() if copied is array else copied

    def _swap_in(self):
        params = []
        for path, param in self._master.namedparams():
            # Without their gradients, which stay on the host untouched
            # (to_device would copy them). Through ``grad_var``, which
            # neither raises nor changes whether the gradient is valid:
            # ``param.grad`` raises while it is not (a lazy parameter not
            # yet initialized, before any cleargrads()), and assigning
            # ``param.grad`` would make it valid.
            params.append((param, param.array, param.grad_var))
            param.grad_var = None
            device_array = self._params.get(path)
            if device_array is not None:
                param.array = device_array
        links = dict(self._master.namedlinks())
        persistents = {}
        for (path, name), value in self._persistents.items():
            persistents[(path, name)] = links[path].__dict__[name]
            setattr(links[path], name, value)
        self._saved = (params, persistents)
        # Links and parameters say they are on the device (no copy: every
        # array is there), so that code asking them for ``xp`` is right.
        self._master.to_device(self._device)


def _inert():
    """The hook a copy of the master gets: it never swaps anything."""
    return DeviceView(None, None, None)


def _on_device(values, device):
    """Whether an array among ``values`` (nested tuples, lists, dicts,
    Variables) lives on ``device``."""
    if isinstance(values, chainer.Variable):
        values = values.array
    if isinstance(values, (tuple, list)):
        return any(_on_device(v, device) for v in values)
    if isinstance(values, dict):
        return any(_on_device(v, device) for v in values.values())
    if isinstance(values, chainer.get_array_types()):
        return chainer.backend.get_device_from_array(values) == device
    return False
