"""The package's import graph: no two modules import each other, directly or
through others, and the runtime never imports the layers above it."""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'cgdp_chainer')


def module_files():
    """Module name -> path, for every module of the package."""
    found = {}
    for folder, _, names in os.walk(ROOT):
        for name in names:
            if not name.endswith('.py'):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(
                os.sep)
            if parts[-1] == '__init__':
                parts = parts[:-1]
            found['.'.join(parts)] = path
    return found


def imported_modules(path, modules):
    """The package's modules that the file imports anywhere in it (also
    inside functions: a deferred import still ties the two modules)."""
    tree = ast.parse(open(path).read(), path)
    package = os.path.relpath(os.path.dirname(path), os.path.dirname(
        ROOT)).replace(os.sep, '.')
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = '.'.join(anchor + ([base] if base else []))
            for alias in node.names:
                full = base + '.' + alias.name
                targets.add(full if full in modules else base)
    return {t for t in targets if t in modules}


def import_graph():
    modules = module_files()
    return {name: imported_modules(path, modules) - {name}
            for name, path in modules.items()}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def without_package_roots(graph):
    """The graph less the edges into a package's ``__init__`` from its own
    modules: ``from cgdp_chainer import blas`` names the module, and a
    package's ``__init__`` importing its children is how packages work."""
    return {name: {t for t in targets if not name.startswith(t + '.')}
            for name, targets in graph.items()}


def test_the_import_graph_finds_a_known_edge():
    graph = import_graph()
    assert 'cgdp_chainer.runtime.host.accumulator' in graph[
        'cgdp_chainer.runtime.updater']


def test_cycle_finder_finds_a_circle():
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [
        ['a', 'b', 'c']]


def test_no_import_circle_in_the_package():
    assert cycles(without_package_roots(import_graph())) == []


@pytest.mark.parametrize('upper', ['cgdp_chainer.costmodel', 'experiments',
                                   'benchmarks'])
def test_the_runtime_imports_nothing_above_it(upper):
    graph = import_graph()
    offenders = sorted(
        '{} -> {}'.format(name, target)
        for name, targets in graph.items()
        if name.startswith('cgdp_chainer.runtime')
        for target in targets if target.startswith(upper))
    assert offenders == []


# The runtime's folders by role, each importing only the ones below it
# (see cgdp_chainer/runtime/__init__.py); the front doors, at the top of
# runtime/, may import them all.
RUNTIME_LAYERS = [('input', 'chunks'), ('workers',), ('replica',),
                  ('host',), ('transport',)]


def runtime_folder(module):
    """The runtime folder a module is in, or None (a front door, or a
    module outside the runtime)."""
    parts = module.split('.')
    if parts[:2] != ['cgdp_chainer', 'runtime'] or len(parts) < 4:
        return None
    return parts[2]


def layer_of(folder):
    for depth, folders in enumerate(RUNTIME_LAYERS):
        if folder in folders:
            return depth
    raise AssertionError('runtime/{} is in no layer'.format(folder))


def test_every_runtime_folder_is_in_a_layer():
    folders = {runtime_folder(name) for name in import_graph()} - {None}
    assert folders == {f for layer in RUNTIME_LAYERS for f in layer}


def test_runtime_folders_import_only_the_folders_below_them():
    offenders = []
    for name, targets in import_graph().items():
        folder = runtime_folder(name)
        if folder is None:
            continue
        for target in targets:
            if target.startswith('cgdp_chainer.runtime') and \
                    runtime_folder(target) is None and \
                    target != 'cgdp_chainer.runtime':
                offenders.append('{} -> {} (a front door)'.format(
                    name, target))
                continue
            other = runtime_folder(target)
            if other is not None and other != folder and \
                    layer_of(other) <= layer_of(folder):
                offenders.append('{} -> {}'.format(name, target))
    assert offenders == []
