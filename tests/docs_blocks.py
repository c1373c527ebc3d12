"""The fenced code blocks of the README and docs/, and how the docs test runs
them.

A block whose language is ``python``, ``bash``, ``sh`` or ``shell`` is run
by ``tests/test_docs.py``. HTML comments on the lines just before its fence
(invisible on the rendered page) may say how:

- ``<!-- test: skip, REASON -->``: not runnable here (a GPU, a cluster, the
  suite itself); the reason is required.
- ``<!-- test: replace OLD => NEW -->`` (any number): run the block with
  ``OLD`` replaced by ``NEW``, to shrink sizes (``NET=resnet152`` to a tiny
  run). ``OLD`` must occur in the block, so the replacement cannot go stale.
- ``<!-- test: output of the block above -->``, before a ``text`` block:
  it shows what the runnable block before it prints on stdout. Its lines
  must be among the printed ones, in their order; a line ``...`` stands
  for any lines left out. So a documented output or figure cannot go
  stale.

Blocks in other languages (``text``, ``csv``, none) show output or layouts
and are not run.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNABLE = ('python', 'bash', 'sh', 'shell')
_FENCE = re.compile(r'^(`{3,})\s*([\w+-]*)')
_DIRECTIVE = re.compile(r'^<!--\s*test:\s*(.*?)\s*-->\s*$')
OUTPUT_DIRECTIVE = 'output of the block above'
ELISION = '...'


class Block(object):
    """One fenced block.

    Args:
        path (str): The Markdown file, relative to the repository.
        line (int): The line of its opening fence (1-based).
        language (str): The fence's language ('' if none).
        text (str): Its content.
        directives (list of str): Its ``test:`` comments, in order.
    """

    def __init__(self, path, line, language, text, directives):
        self.path = path
        self.line = line
        self.language = language
        self.text = text
        self.directives = directives
        # The text block that shows this block's output, if any.
        self.output_block = None

    @property
    def id(self):
        return '{}:{}'.format(self.path, self.line)

    @property
    def runnable(self):
        return self.language in RUNNABLE

    @property
    def skip_reason(self):
        """The reason given for not running it, or None."""
        for directive in self.directives:
            if directive.startswith('skip'):
                return directive[len('skip'):].lstrip(' ,:') or ''
        return None

    @property
    def shows_output(self):
        """Whether it shows the output of the block above it."""
        return OUTPUT_DIRECTIVE in self.directives

    def missing_output(self, stdout):
        """The lines of :attr:`output_block` that ``stdout`` lacks (in
        order; trailing spaces ignored), ``[]`` where all are there."""
        printed = iter(line.rstrip() for line in stdout.split('\n'))
        missing = []
        for line in self.output_block.text.rstrip('\n').split('\n'):
            line = line.rstrip()
            if line == ELISION:
                continue
            if not any(found == line for found in printed):
                missing.append(line)
                printed = iter(line.rstrip() for line in stdout.split('\n'))
        return missing

    def replacements(self):
        """``(old, new)`` pairs of its ``replace`` directives."""
        pairs = []
        for directive in self.directives:
            if directive.startswith('replace '):
                old, _, new = directive[len('replace '):].partition(' => ')
                pairs.append((old, new))
        return pairs

    def text_to_run(self, **names):
        """The text with its replacements made, then ``{name}`` fields
        (``{tmp}``: the test's folder) filled in.

        Raises:
            ValueError: A replacement's ``OLD`` does not occur in the block.
        """
        text = self.text
        for old, new in self.replacements():
            if old not in text:
                raise ValueError('{}: "{}" is not in the block'.format(
                    self.id, old))
            text = text.replace(old, new.format(**names))
        return text


def markdown_files():
    """The README and every Markdown file under docs/, relative paths."""
    paths = ['README.md']
    for folder, _, names in os.walk(os.path.join(ROOT, 'docs')):
        paths += [os.path.relpath(os.path.join(folder, name), ROOT)
                  for name in sorted(names) if name.endswith('.md')]
    return paths


def blocks(path):
    """Every fenced block of one Markdown file."""
    lines = open(os.path.join(ROOT, path)).read().split('\n')
    found = []
    directives = []
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        directive = _DIRECTIVE.match(line.strip())
        if directive:
            directives.append(directive.group(1))
        elif fence:
            end = index + 1
            while end < len(lines) and not lines[end].startswith(
                    fence.group(1)):
                end += 1
            block = Block(path, index + 1, fence.group(2).lower(),
                          '\n'.join(lines[index + 1:end]) + '\n', directives)
            if block.shows_output and found:
                found[-1].output_block = block
            found.append(block)
            directives = []
            index = end
        elif line.strip():
            directives = []
        index += 1
    return found


def all_blocks():
    return [block for path in markdown_files() for block in blocks(path)]


_LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)')


def relative_links(path):
    """``(line, target)`` of every link and image of a Markdown file that
    points inside the repository (not a URL, not a pure anchor)."""
    links = []
    in_fence = False
    for number, line in enumerate(open(os.path.join(ROOT, path)), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in _LINK.finditer(line):
            target = match.group(1) or match.group(2)
            if re.match(r'^[a-z]+:', target) or target.startswith('#'):
                continue
            links.append((number, target))
    return links


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    in_fence = False
    for line in open(os.path.join(ROOT, path)):
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith('#'):
            continue
        title = line.lstrip('#').strip().lower()
        title = re.sub(r'[^\w\- ]', '', title)
        found.add(title.replace(' ', '-'))
    return found
