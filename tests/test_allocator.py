"""cgdp_chainer.allocator: a process that keeps freed memory steps without
page faults, and a user's own allocator settings are left alone."""
import os
import subprocess
import sys

import pytest

from cgdp_chainer import allocator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small convolutional net's training steps in a fresh process: the
# minor page faults per step once the first steps have run. A forward
# before the loop (as a lazy model's initialization runs one) leaves
# glibc's default thresholds where every step faults its temporaries in
# anew.
STEPS = '''
import resource, sys
from cgdp_chainer import allocator  # first: lets Chainer import on NumPy 2
import chainer, chainer.functions as F, chainer.links as L, numpy
applied = allocator.keep_freed_memory()
model = L.Classifier(chainer.Sequential(
    L.Convolution2D(3, 16, 3, pad=1), F.relu,
    L.Convolution2D(16, 32, 3, pad=1), F.relu, L.Linear(None, 10)))
rng = numpy.random.RandomState(0)
x = rng.normal(size=(32, 3, 32, 32)).astype(numpy.float32)
t = rng.randint(0, 10, 32).astype(numpy.int32)
model(x, t)
for step in range(6):
    if step == 2:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.cleargrads()
    model(x, t).backward()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(applied, faults / 4.0)
'''


def steady_faults(env):
    done = subprocess.run([sys.executable, '-c', STEPS], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    applied, faults = done.stdout.split()
    return applied == 'True', float(faults)


@pytest.mark.skipif(not sys.platform.startswith('linux'),
                    reason="glibc's mallopt is Linux's")
def test_steps_reuse_the_pages_the_last_step_freed():
    env = {key: value for key, value in os.environ.items()
           if key not in allocator.USER_SETTINGS}
    applied, faults = steady_faults(env)
    assert applied
    # A step's temporaries are megabytes: thousands of faults each if
    # they came as new pages (measured: 12,600 per step of a larger net).
    assert faults < 50, faults


def test_the_users_own_allocator_settings_are_left_alone():
    for name in allocator.USER_SETTINGS:
        assert not allocator.keep_freed_memory({name: '1'})
