"""The README and docs/ cannot rot: every link resolves, and every shell and
Python block runs (with the sizes its ``test: replace`` comments give) or
says why it cannot run here (see tests/docs_blocks.py)."""
import os
import re
import subprocess
import sys

import numpy
import pytest

import docs_blocks

BLOCKS = docs_blocks.all_blocks()
TO_RUN = [b for b in BLOCKS if b.runnable and b.skip_reason is None]
BLOCK_TIMEOUT_SECONDS = 600


def fake_mnist(root, n_train=240, n_test=60):
    """MNIST-shaped random digits where ``chainer.datasets.get_mnist`` looks
    first (``CHAINER_DATASET_ROOT``), so nothing is downloaded."""
    folder = os.path.join(root, 'pfnet', 'chainer', 'mnist')
    os.makedirs(folder)
    random = numpy.random.RandomState(0)
    for name, n in (('train.npz', n_train), ('test.npz', n_test)):
        numpy.savez_compressed(
            os.path.join(folder, name),
            x=random.randint(0, 256, size=(n, 784)).astype(numpy.uint8),
            y=random.randint(0, 10, size=n).astype(numpy.uint8))


def run_block(block, tmp_path):
    fake_mnist(str(tmp_path / 'datasets'))
    env = dict(os.environ, PYTHONPATH=docs_blocks.ROOT,
               CHAINER_DATASET_ROOT=str(tmp_path / 'datasets'),
               PATH=os.path.dirname(sys.executable) + os.pathsep +
               os.environ.get('PATH', ''))
    text = block.text_to_run(tmp=str(tmp_path))
    if block.language == 'python':
        script = tmp_path / 'block.py'
        script.write_text(text)
        command, cwd = [sys.executable, str(script)], str(tmp_path)
    else:
        command = ['bash', '-e', '-o', 'pipefail', '-c', text]
        cwd = docs_blocks.ROOT
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_SECONDS)


def test_blocks_are_found():
    assert any(b.path == 'README.md' and b.runnable for b in BLOCKS)


@pytest.mark.parametrize('path', docs_blocks.markdown_files())
def test_every_link_resolves(path):
    broken = []
    for line, target in docs_blocks.relative_links(path):
        file_part, _, anchor = target.partition('#')
        resolved = os.path.normpath(os.path.join(
            docs_blocks.ROOT, os.path.dirname(path), file_part))
        if not os.path.exists(resolved):
            broken.append('{}:{} {}'.format(path, line, target))
        elif anchor and resolved.endswith('.md') and anchor not in \
                docs_blocks.anchors(os.path.relpath(resolved,
                                                    docs_blocks.ROOT)):
            broken.append('{}:{} {} (no such heading)'.format(
                path, line, target))
    assert broken == []


def test_every_block_not_run_says_why():
    silent = [b.id for b in BLOCKS if b.skip_reason == '']
    assert silent == []


def test_every_replacement_still_matches():
    for block in BLOCKS:
        block.text_to_run(tmp='/tmp/x')  # raises naming a stale one


@pytest.mark.slow
@pytest.mark.parametrize('block', TO_RUN, ids=[b.id for b in TO_RUN])
def test_block_runs(block, tmp_path):
    completed = run_block(block, tmp_path)
    assert completed.returncode == 0, '{}\n{}\n{}'.format(
        block.text_to_run(tmp=str(tmp_path)), completed.stdout[-3000:],
        completed.stderr[-3000:])
    if block.output_block is not None:
        assert block.missing_output(completed.stdout) == [], \
            '{} no longer prints what {} shows:\n{}'.format(
                block.id, block.output_block.id, completed.stdout[-3000:])


def test_every_shown_output_follows_a_block_that_runs():
    shown = [b for b in BLOCKS if b.shows_output]
    assert shown, 'no documented output is checked'
    owners = {b.output_block.id: b for b in BLOCKS if b.output_block}
    for block in shown:
        owner = owners.get(block.id)
        assert block.language == 'text' and owner is not None and \
            owner in TO_RUN, block.id


def test_an_output_check_finds_lines_in_order_only():
    block = docs_blocks.Block('p.md', 1, 'bash', 'x\n', [])
    block.output_block = docs_blocks.Block(
        'p.md', 5, 'text', 'a  1\n...\nc  3\n',
        [docs_blocks.OUTPUT_DIRECTIVE])
    assert block.missing_output('a  1  \nb  2\nc  3\n') == []
    assert block.missing_output('c  3\na  1\n') == ['c  3']
    assert block.missing_output('a  1\nc  4\n') == ['c  3']


# The README's figures from the cost model: ResNet-152 on minsky's speedups
# over the typical updater, as COSTMODEL.md's checked output shows them.
_README_FIGURES = re.compile(
    r'ResNet-152 on `minsky`: ([\d.]+)x, ([\d.]+)x and ([\d.]+)x')


def test_readmes_cost_model_figures_are_the_checked_outputs():
    with open(os.path.join(docs_blocks.ROOT, 'README.md')) as f:
        figures = _README_FIGURES.findall(' '.join(f.read().split()))
    assert len(figures) == 1
    shown = [b for b in docs_blocks.blocks('docs/COSTMODEL.md')
             if b.shows_output][0]
    lines = shown.text.splitlines()
    column = lines[0].split().index('x_typ')
    x_typ = [line.split()[column] for line in lines
             if line.startswith('resnet152  minsky ')]
    assert list(figures[0]) == x_typ


def test_directives_are_read(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('<!-- test: skip, needs a GPU -->\n```bash\nmake gpu\n'
                    '```\n\n<!-- test: replace 20 => 2 -->\n```python\n'
                    'print(20)\n```\n\n```text\nout\n```\n')
    original = docs_blocks.ROOT
    docs_blocks.ROOT = str(tmp_path)
    try:
        found = docs_blocks.blocks('page.md')
    finally:
        docs_blocks.ROOT = original
    assert [(b.language, b.skip_reason, b.runnable) for b in found] == [
        ('bash', 'needs a GPU', True), ('python', None, True),
        ('text', None, False)]
    assert found[1].text_to_run() == 'print(2)\n'
    with pytest.raises(ValueError, match='"30" is not in the block'):
        docs_blocks.Block('p.md', 1, 'sh', 'x\n', ['replace 30 => 3']
                          ).text_to_run()
