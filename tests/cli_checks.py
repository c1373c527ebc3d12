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
