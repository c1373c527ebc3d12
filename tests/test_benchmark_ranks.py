"""benchmarks.runtime's ``ranks`` part runs end to end: two MPI jobs (CGDP's
and ChainerMN's multi-node optimizer) and the limit, on a tiny net, and
prints its table of seconds and ratios. Timings are not checked (a shared
2-core machine says nothing about them); only that every row is there."""
import os
import re
import subprocess
import sys

import pytest

from cgdp_chainer import mpi as cgdp_mpi

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = r'\d+\.\d+'


@pytest.mark.mpi
@pytest.mark.slow
def test_ranks_part_prints_seconds_and_ratios_with_goals():
    if cgdp_mpi.find_mpiexec() is None:
        pytest.skip(cgdp_mpi.no_mpiexec_words())
    pytest.importorskip('mpi4py')
    job = subprocess.run(
        [sys.executable, '-m', 'benchmarks.runtime', '--parts', 'ranks',
         '--net', 'models.examples:tiny', '--image-size', '8', '--batch',
         '2', '--rounds', '1', '--iterations', '2', '--warmup', '1'],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        universal_newlines=True, timeout=300)
    output = job.stdout
    assert job.returncode == 0, output
    for row in ('CGDP create_multi_node_optimizer',
                r'CGDP, a host per rank \(node_host=False\)',
                r'ChainerMN create_multi_node_optimizer \(naive\)',
                r'limit \(2 StandardUpdater processes\)'):
        assert re.search(r'\[ranks\] +{} +{} s'.format(row, NUMBER),
                         output), output
    for ratio, goal in (('CGDP / limit', r' \(goal <= 1\.02\)'),
                        ('CGDP / ChainerMN', r' \(goal < 1\.00\)'),
                        ('CGDP / CGDP with a host per rank', ''),
                        ('ChainerMN / limit', '')):
        assert re.search(r'\[ranks\] +{} +{}{}'.format(ratio, NUMBER, goal),
                         output), output
