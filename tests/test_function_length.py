"""No function of the project's code runs over 80 lines: a long function is
split along the steps it performs, each named for what it does."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ('cgdp_chainer', 'experiments', 'benchmarks')
MAX_LINES = 80


def functions(folder):
    """``(path:name, lines)`` of every function and method in ``folder``,
    counted from the ``def`` line (decorators excluded) to its last line."""
    found = []
    for directory, _, names in os.walk(os.path.join(ROOT, folder)):
        for name in sorted(names):
            if not name.endswith('.py'):
                continue
            path = os.path.join(directory, name)
            tree = ast.parse(open(path).read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append(('{}:{}'.format(
                        os.path.relpath(path, ROOT), node.name),
                        node.end_lineno - node.lineno + 1))
    return found


def test_the_counter_sees_this_file():
    lengths = dict(functions('tests'))
    assert lengths['tests/test_function_length.py:functions'] > 5


@pytest.mark.parametrize('folder', FOLDERS)
def test_no_function_over_80_lines(folder):
    long = sorted(item for item in functions(folder)
                  if item[1] > MAX_LINES)
    assert long == []
