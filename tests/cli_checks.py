"""What the command lines' tests share."""


def assert_usage_error(completed, *fragments):
    """Exit status 2, one ``error:`` line on stderr, no traceback."""
    assert completed.returncode == 2, (completed.stdout, completed.stderr)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith('error: '), completed.stderr
    assert 'Traceback' not in completed.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# Bad values of the options that benchmarks.gpu and benchmarks.gpu_anyloop
# share (benchmarks.gpu.add_sizes_and_rounds), each with what the one error
# line must name.
BAD_SIZES_AND_ROUNDS = [
    (['--batches', '0'], 'positive'),
    (['--batches', '64,x'], 'x'),
    (['--batches', ','], 'no batch size'),
    (['--nets', 'nosuchnet'], 'nosuchnet'),
    (['--nets', 'alexnet', '--image-size', '8'], 'alexnet'),
    (['--device', '@nosuch'], '@nosuch'),
    (['--device', '@numpy,@numpy'], 'one device'),
    (['--iterations', '0'], 'positive'),
    (['--rounds', '-1'], '-1'),
    (['--warmup', 'x'], 'x'),
]
