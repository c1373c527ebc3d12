"""A model on a GPU under the multi-node optimizer: its host shadow and its
hand-over.

ChainerMN's optimizer form keeps the actual optimizer on the user's model
(``optimizer.target``), which a script may have on its rank's GPU. CGDP
keeps the master weights and the optimizer state on the host, so such a
model becomes the one replica of its rank:

* :func:`host_shadow` builds a host copy of the model's link tree whose
  parameters hold the model's values in host memory and carry the model's
  own update rules (bound to the actual optimizer's hyperparameters, with
  their hooks; any state moves to the host). The actual optimizer is then
  pointed at the shadow, so its state serializes under the model's
  parameter paths, exactly as ChainerMN's run saves it.
* :class:`DevicePort` is the host accumulator's side of the model: the
  updater's :class:`~cgdp_chainer.runtime.transport.cuda_transfer.ChunkedCudaTransfer`
  moves each chunk's gradients out on a copy stream as soon as the backward
  made them final, and its new weights (and the mean gradient, which
  ChainerMN leaves in ``param.grad``) back the same way.

Every CUDA operation goes through the transfer's ``copies`` object, so the
whole path also runs on the CPU with a NumPy stand-in (the tests' device
whose copies go through the same transfer class).
"""
import threading

import chainer
import numpy

from cgdp_chainer.runtime.transport import buffers
from cgdp_chainer.runtime.transport import transfer as transfer_module


def model_device(model, device_copies=None):
    """The device of a model that trains as a device replica, or None.

    Args:
        model (chainer.Link): The actual optimizer's target, initialized.
        device_copies (callable or None): Given: the model trains through
            the GPU path whatever its device (a stand-in of CUDA's copies).

    Returns:
        chainer.backend.Device or None: None for a host model ('@numpy',
        which trains as the CPU form does).

    Raises:
        ValueError: The parameters are on several devices.
    """
    devices = {}
    for name, param in model.namedparams():
        if param.array is not None:
            device = chainer.backend.get_device_from_array(param.array)
            devices.setdefault(str(device), (device, name))
    if len(devices) > 1:
        raise ValueError(
            'the model\'s parameters are on several devices ({}); the '
            'multi-node optimizer trains one model per rank on one device: '
            'move it with model.to_device(...) first'.format(', '.join(
                '{} on {}'.format(name, key)
                for key, (_, name) in sorted(devices.items()))))
    if not devices:
        return None
    device, _ = next(iter(devices.values()))
    if device_copies is None and device.xp is numpy:
        return None
    if device_copies is None and not _is_cupy_device(device):
        raise ValueError(
            'the model is on {}; the multi-node optimizer trains models on '
            '\'@numpy\' or on a CuPy GPU (\'@cupy:N\'): move it with '
            'model.to_device(...)'.format(device))
    return device


def _is_cupy_device(device):
    return type(device).__name__ == 'GpuDevice'


def host_shadow(model):
    """A host copy of ``model`` for the host's master weights.

    The copy shares the model's link objects' other attributes (it is
    ``model.copy(mode='share')``) but holds parameters of its own, in host
    memory, with the model's values and the model's update rules (the same
    objects: their hyperparameters follow the actual optimizer's, their
    hooks apply); an update rule's state moves to the host.

    Args:
        model (chainer.Link): The user's model, every parameter initialized.

    Returns:
        chainer.Link: The shadow; its ``namedparams()`` are the model's
        paths.
    """
    originals = dict(model.namedparams())
    shadow = model.copy(mode='share')
    cpu = chainer.backend.CpuDevice()
    for path, link in shadow.namedlinks():
        prefix = '' if path == '/' else path
        for own, _ in list(link.namedparams()):
            if own.count('/') != 1:  # a child's parameter
                continue
            original = originals[prefix + own]
            param = chainer.Parameter(
                numpy.array(cpu.send(original.array)), name=original.name)
            rule = original.update_rule
            param.update_rule = rule
            if rule is not None and rule.state is not None:
                for key, value in list(rule.state.items()):
                    if isinstance(value, chainer.get_array_types()):
                        rule.state[key] = cpu.send(value)
            # Outside an init scope this only rebinds the attribute: the
            # name is the shadow link's parameter already.
            setattr(link, own[1:], param)
    return shadow


class DevicePort(object):
    """The host accumulator's side of the user's model on its device.

    The model's parameters become views of the transfer's flat device
    buffer; its gradients leave, per chunk, through the transfer's copy
    stream into ``slot_buffer``; the host's new weights of a chunk and its
    mean gradient come back through the other copy stream. At the end of
    each ``update()`` (:meth:`finish`) the caller's stream is ordered after
    every copy, so anything that reads the model next (a forward, an
    evaluator, a ``save_npz``) sees the new weights, without the host
    waiting for the copies.

    Args:
        transfer (ChunkedCudaTransfer): Built over the master's buffer and
            the model's parameters.
        host_params (dict): Path -> the host shadow's parameter (whose
            ``grad`` holds the update's gradient after a chunk's update).
    """

    is_gpu = True

    def __init__(self, transfer, host_params):
        self.transfer = transfer
        self.host_params = host_params
        self.device_params = transfer.replica_params
        self.slot_buffer = transfer.slot_buffer
        layout = transfer.layout
        self._grad_views = layout.views(transfer.grad_buffer)
        with transfer.copies.device_scope():
            self._grad_return = transfer.copies.pinned_buffer(
                layout.capacity)
        self._grad_staging = layout.views(self._grad_return)
        # The arrays the transfer bound; another array in their place was
        # put there by the script.
        self._bound = {name: param.array
                       for name, param in self.device_params.items()}
        # The device buffer's bytes as the last update left them: what the
        # script wrote in place since (a WGAN's clipping, say) must reach
        # the master before the next update, as it does for a host model.
        with transfer.copies.device_scope():
            self._published = transfer.copies.device_buffer(
                layout.capacity)
        self._views = layout.views(transfer.param_buffer)
        self._published_views = layout.views(self._published)
        # publish() comes from the host's threads, a chunk each.
        self._lock = threading.Lock()
        self._returned = set()
        # What check_arrays started for written_in_place to read.
        self._written_check = None

    def send_grads(self, names):
        """Starts the chunk's gradients to the slots (see the transfer)."""
        return self.transfer.send_grads(names)

    def wait_grads(self, ready):
        self.transfer.wait_grads(ready)

    def publish(self, chunk, names):
        """The chunk is updated: its gradient, then its weights, start to
        the device on the copy stream (the weights' event covers both)."""
        with self._lock:
            self._return_grads(names)
            self.transfer.publish(chunk, names)

    def _return_grads(self, names):
        transfer = self.transfer
        for name in names:
            grad = self.host_params[name].grad
            staging = self._grad_staging[name]
            if grad is None:
                staging.fill(0)
            else:
                numpy.copyto(staging, grad)
        span = transfer.layout.span(names)
        with transfer.copies.device_scope():
            transfer.copies.h2d(
                self._grad_return[span.start:span.stop],
                transfer.grad_buffer[span.start:span.stop],
                transfer.h2d_stream)
        self._returned.update(names)

    def publish_weights(self, chunk_names):
        """Every chunk's weights to the device, and the caller's stream
        after them (the start's broadcast weights; no gradient)."""
        for chunk, names in enumerate(chunk_names):
            self.transfer.publish(chunk, names)
        self._order_after_copies(len(chunk_names))

    def finish(self, n_chunks):
        """Ends an ``update()``, after the host published every chunk: the
        model's ``param.grad`` are the mean gradients on the device, the
        caller's stream waits for every copy.

        Args:
            n_chunks (int): The runtime's chunks.
        """
        # Set here, in the caller's thread: the backward may still have
        # been running while the host published the first chunks.
        for name in self._returned:
            self.device_params[name].grad = self._grad_views[name]
        self._returned = set()
        self._order_after_copies(n_chunks)

    def _order_after_copies(self, n_chunks):
        # Not a wait per layer in the next forward: the chunks' copies run
        # in order on one copy stream, and the last one published holds
        # the input side's layers, which that forward runs first, so it
        # would start no sooner. And every read of the model (an edit, an
        # evaluator, a save), not only a forward, must see the new values.
        for chunk in range(n_chunks):
            self.transfer.wait_params(chunk)
        # On the caller's stream, after the copies it now waits for.
        self._published[...] = self.transfer.param_buffer

    def check_arrays(self):
        """What the script did to the model's arrays since the last update:
        the arrays it replaced, at once; whether it wrote into any in place
        is found on the device, and read by :meth:`written_in_place`.

        Returns:
            list of str: Parameters whose array was replaced on the same
            device (their values must reach the master).

        Raises:
            ValueError: A parameter moved to another device, with the fix.
        """
        replaced = []
        device = self.transfer.device
        for name, param in self.device_params.items():
            array = param.array
            if array is self._bound[name]:
                continue
            moved = chainer.backend.get_device_from_array(array)
            if moved != device:
                raise ValueError(
                    'parameter {} of the model moved from {} to {} after '
                    'the multi-node optimizer\'s first update; its copies '
                    'run between the host and {}: move the model back with '
                    'model.to_device(\'{}\') before update(), or make a new '
                    'multi-node optimizer (with a new actual optimizer) '
                    'for the model on its new device'.format(
                        name, device, moved, device, device))
            replaced.append(name)
        # One comparison over the whole buffer, on the caller's stream; its
        # answer comes back ahead of the first gradients, not read now
        # (which would wait for every copy of the last update).
        xp = chainer.backend.get_array_module(self._published)
        changed = xp.any(self._published != self.transfer.param_buffer)
        self._written_check = (self.transfer.read_back([changed]),
                               set(replaced))
        return replaced

    def written_in_place(self):
        """The parameters, other than those :meth:`check_arrays` found
        replaced, whose bytes differ from what the last update left: read
        once per update, before its first hand-over (the backward has run
        a layer since the answer's copy started: it has landed). Only where
        something was written is each parameter compared, the host waiting.

        Returns:
            list of str: Their names (their values must reach the master).
        """
        check, self._written_check = self._written_check, None
        if check is None:
            return []
        ((changed,), copied), replaced = check
        if not getattr(copied, 'done', False):
            copied.synchronize()
        if not changed:
            return []
        xp = chainer.backend.get_array_module(self._published)
        return [name for name, view in self._views.items()
                if name not in replaced and
                bool(xp.any(view != self._published_views[name]))]

    def pull(self, names):
        """Copies the model's current values of ``names`` into the host
        master (weights the script wrote or loaded into the model); a
        replaced array's values go into the device buffer, whose view the
        parameter is again, so the next updates reach it."""
        cpu = chainer.backend.CpuDevice()
        for name in names:
            param = self.device_params[name]
            numpy.copyto(self.host_params[name].array, cpu.send(param.array))
            view = self._bound[name]
            if param.array is not view:
                view[...] = param.array
                param.array = view

    def close(self):
        self.transfer.close()
        self.slot_buffer = None


def build_port(layout, master_buffer, slot_buffer, host_params,
               device_params, device, device_copies=None,
               shared_regions=()):
    """The :class:`DevicePort` of a model on ``device``.

    Args:
        layout (FlatLayout): The master's layout.
        master_buffer (numpy.ndarray): The master's flat buffer.
        slot_buffer (numpy.ndarray or None): The rank's gradient slots (a
            node's shared slot), or None for pinned slots of its own.
        host_params (dict): Path -> the shadow's parameter.
        device_params (dict): Path -> the model's parameter.
        device (chainer.backend.Device): The model's device.
        device_copies (callable or None): ``device_copies(device)`` gives
            the stand-in of CUDA's operations; None: CuPy's.
        shared_regions (sequence): Byte views of shared memory that the
            copies read or write (page-locked here; where that fails, the
            copies are staged through pinned buffers).
    """
    from cgdp_chainer.runtime.transport import cuda_transfer
    copies = device_copies(device) if device_copies is not None else None
    staged = False
    if shared_regions and copies is None:
        why = transfer_module.page_lock(list(shared_regions),
                                        transfer_module.host_register)
        staged = why is not None
    transfer = cuda_transfer.ChunkedCudaTransfer(
        layout, master_buffer, slot_buffer, device_params, device,
        staged=staged, copies=copies)
    return DevicePort(transfer, host_params)


def pinned_master_buffer(capacity, device_copies=None):
    """The flat host buffer of a rank's own master: pinned for CuPy's
    asynchronous copies (the stand-in's host memory otherwise)."""
    if device_copies is not None:
        return buffers.host_buffer(capacity)
    return buffers.host_buffer(capacity, transfer_module.pinned_bytes)
