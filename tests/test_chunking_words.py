"""The updater describes the chunking that ran, for figures and logs."""
import chainer
import chainer.links as L
import numpy
import pytest

import cgdp_chainer


class Deep(chainer.Chain):

    def __init__(self):
        super(Deep, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, 600)
            self.l2 = L.Linear(600, 600)
            self.l3 = L.Linear(600, 3)

    def forward(self, x):
        return self.l3(self.l2(self.l1(x)))


@pytest.mark.parametrize('arguments, words', [
    ({}, r'{} of >= 1 MiB'),
    ({'chunk_size': 2}, r'{} of 2 layers'),
    ({'chunk_size': 1}, r'{} of 1 layer'),
    ({'chunk_bytes': 1536}, r'{} of >= 1.5 KiB'),
    ({'chunk_size': [0, 2]}, r'{} starting at layers [0, 2]'),
    # All layers in one chunk: singular.
    ({'chunk_bytes': 1 << 30}, r'{} of >= 1 GiB'),
])
def test_chunking_description_names_the_plan_that_ran(arguments, words):
    model = L.Classifier(Deep())
    optimizer = chainer.optimizers.SGD(0.01).setup(model)
    x = numpy.random.RandomState(0).randn(8, 8).astype(numpy.float32)
    t = (numpy.arange(8) % 3).astype(numpy.int32)
    iterator = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 4, shuffle=False)
    updater = cgdp_chainer.CGDPUpdater(
        iterator, optimizer, ['@numpy', '@numpy'], workers='thread',
        **arguments)
    try:
        assert updater.chunking_description.startswith('? chunks')
        updater.update()
    finally:
        updater.finalize()
    n_chunks = updater.chunk_plan.n_chunks
    chunks = '1 chunk' if n_chunks == 1 else '{} chunks'.format(n_chunks)
    assert updater.chunking_description == words.format(chunks)
    assert (n_chunks == 1) == ('chunk_bytes' in arguments and
                               arguments['chunk_bytes'] == 1 << 30)
