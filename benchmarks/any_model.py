"""CGDP on any model: the readiness path against the stage path it replaced,
and a model without stages against ParallelUpdater, side by side in one run.

    python -m benchmarks.any_model [--parts all | resnet152,resnet50]
        [--image-size 64] [--batch 2] [--iterations 4] [--warmup 2]
        [--rounds 2] [--stage-rev ec1524b]
        [--chunkings default,bytes:1048576,layers:8]

- ``resnet152``: ResNet-152 from ``models/``, two ``'@numpy'`` replicas in
  worker processes, MomentumSGD: the runtime of this tree (one ordinary
  backward, chunks handed over as their parameters become ready; one run
  per ``--chunkings`` entry) against the stage path (chunks cut between
  ``stages``, one stage per chunk) of revision ``--stage-rev``, exported
  with ``git archive`` into a temporary folder. Iteration time and exposed
  sync (from the timeline: from the last backward's end to the last
  publish) per variant, and their ratios to the stage path (target: time
  ratio <= 1.02, exposed sync no larger).
- ``resnet50``: Chainer's ``L.ResNet50Layers(pretrained_model=None)``, no
  stages, two replicas: CGDP (default chunks, worker processes) over
  ParallelUpdater.

Each variant runs in a fresh process, variants alternate round by round,
and medians are printed: the machines here are shared and noisy, so only
ratios from one run mean anything.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

# First: the child of the stage path finds another tree's cgdp_chainer
# first on its path, and Chainer comes after it (its compat module).
import cgdp_chainer  # NOQA
import chainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ('resnet152', 'resnet50')


def _child_main(spec):
    """Runs one variant in this process and prints its times as JSON.

    Args:
        spec (dict): ``variant`` (``'cgdp'``, ``'parallel'``), ``net``
            (``'resnet152'`` from ``models/`` or ``'resnet50-chainer'``),
            ``chunking`` (``'default'``, ``'bytes:N'``, ``'layers:N'`` or
            ``'stages:N'`` for the old runtime), ``image_size``, ``batch``,
            ``iterations``, ``warmup``.
    """
    import models
    from chainer.training import updaters
    from cgdp_chainer import datasets
    import time

    n = 2
    if spec['net'] == 'resnet50-chainer':
        model = chainer.links.Classifier(ResNet50Net())
    else:
        model = models.Classifier(models.get_model(spec['net'], seed=0))
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    data = datasets.SyntheticImageNet(spec['batch'] * n * 2,
                                      spec['image_size'], n_classes=1000,
                                      seed=0)
    iterator = chainer.iterators.SerialIterator(data, spec['batch'] * n,
                                                shuffle=False)
    timeline = None
    if spec['variant'] == 'parallel':
        updater = updaters.ParallelUpdater(
            iterator, optimizer, devices={'main': '@numpy',
                                          'second': '@numpy'})
    else:
        timeline = cgdp_chainer.Timeline()
        kind, _, value = spec['chunking'].partition(':')
        kwargs = {}
        if kind in ('layers', 'stages'):
            kwargs['chunk_size'] = int(value)
        elif kind == 'bytes':
            kwargs['chunk_bytes'] = int(value)
        updater = cgdp_chainer.CGDPUpdater(
            iterator, optimizer, ['@numpy'] * n, timeline=timeline, **kwargs)
    times = []
    try:
        for i in range(spec['warmup'] + spec['iterations']):
            start = time.perf_counter()
            updater.update()
            if i >= spec['warmup']:
                times.append(time.perf_counter() - start)
        n_chunks = len(getattr(updater, 'chunks', [None]))
    finally:
        updater.finalize()
    exposed = []
    if timeline is not None:
        exposed = [s['exposed_sync'] for s in
                   timeline.iteration_summaries[spec['warmup']:]]
    print('RESULT ' + json.dumps({'times': times, 'exposed': exposed,
                                  'chunks': n_chunks}), flush=True)


class ResNet50Net(chainer.Chain):
    """Chainer's ``L.ResNet50Layers(pretrained_model=None)`` returning its
    ``fc6`` output (its global pooling takes any image size)."""

    def __init__(self):
        super(ResNet50Net, self).__init__()
        with self.init_scope():
            self.net = chainer.links.ResNet50Layers(pretrained_model=None)

    def forward(self, x):
        return self.net(x, layers=['fc6'])['fc6']


def _run_child(spec, code_root):
    """Runs :func:`_child_main` in a fresh interpreter whose
    ``cgdp_chainer`` and ``models`` come from ``code_root``."""
    program = (
        'import sys\n'
        'sys.path[:0] = [{code!r}, {root!r}]\n'
        'from benchmarks import any_model\n'
        "if __name__ == '__main__':\n"
        '    any_model._child_main({spec!r})\n').format(
            code=code_root, root=ROOT, spec=spec)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([code_root, ROOT])
    result = subprocess.run([sys.executable, '-c', program],
                            capture_output=True, text=True, env=env,
                            cwd=code_root, timeout=3600)
    lines = [line for line in result.stdout.splitlines()
             if line.startswith('RESULT ')]
    if result.returncode != 0 or not lines:
        raise RuntimeError('variant {} failed:\n{}{}'.format(
            spec, result.stdout[-3000:], result.stderr[-3000:]))
    return json.loads(lines[-1][len('RESULT '):])


def export_revision(rev, folder):
    """Writes ``cgdp_chainer/``, ``models/`` and ``experiments/`` of git
    revision ``rev`` into ``folder``."""
    archive = subprocess.run(
        ['git', '-C', ROOT, 'archive', '--format=tar', rev, 'cgdp_chainer',
         'models', 'experiments'], capture_output=True)
    if archive.returncode != 0:
        raise RuntimeError('git archive {} failed: {}'.format(
            rev, archive.stderr.decode(errors='replace').strip()))
    subprocess.run(['tar', '-x', '-C', folder], input=archive.stdout,
                   check=True)


def compare(variants, args):
    """Alternates the variants round by round.

    Args:
        variants (list of (str, dict, str)): Label, spec, code root.

    Returns:
        dict: Label to ``(median seconds, median exposed sync, chunks)``.
    """
    times = {label: [] for label, _, _ in variants}
    exposed = {label: [] for label, _, _ in variants}
    chunks = {}
    for _ in range(args.rounds):
        for label, spec, code_root in variants:
            result = _run_child(spec, code_root)
            times[label] += result['times']
            exposed[label] += result['exposed']
            chunks[label] = result['chunks']
            print('  {}: {}'.format(label, ' '.join(
                '{:.3f}'.format(t) for t in result['times'])), flush=True)
    return {label: (statistics.median(times[label]),
                    statistics.median(exposed[label])
                    if exposed[label] else None, chunks[label])
            for label in times}


def _spec(args, **fields):
    spec = dict(image_size=args.image_size, batch=args.batch,
                iterations=args.iterations, warmup=args.warmup)
    spec.update(fields)
    return spec


def chunking_list(text):
    """argparse type: comma-separated ``default``, ``bytes:N`` or
    ``layers:N``."""
    import argparse
    entries = [e.strip() for e in text.split(',') if e.strip()]
    for entry in entries:
        kind, _, value = entry.partition(':')
        if entry == 'default':
            continue
        if kind not in ('bytes', 'layers') or not value.isdigit() or \
                int(value) < 1:
            raise argparse.ArgumentTypeError(
                'unknown chunking {!r}; use default, bytes:N or layers:N '
                '(N a positive integer), comma-separated'.format(entry))
    if not entries:
        raise argparse.ArgumentTypeError('give at least one chunking')
    return entries


def build_parser():
    from experiments import cli
    parser = cli.ArgumentParser(prog='python -m benchmarks.any_model',
                                description=__doc__.splitlines()[0])
    parser.add_argument('--parts', type=cli.name_list(PARTS, 'part', 'all'),
                        default=list(PARTS))
    parser.add_argument('--image-size', type=cli.positive_int, default=64)
    parser.add_argument('--batch', type=cli.positive_int, default=2,
                        help='examples per replica')
    parser.add_argument('--iterations', type=cli.positive_int, default=4)
    parser.add_argument('--warmup', type=cli.non_negative_int, default=2)
    parser.add_argument('--rounds', type=cli.positive_int, default=2)
    parser.add_argument('--stage-rev', default='ec1524b',
                        help='git revision whose runtime has the stage path')
    parser.add_argument('--chunkings', type=chunking_list,
                        default=['default'],
                        help='readiness chunkings to run: default, bytes:N, '
                             'layers:N (comma-separated)')
    return parser


def main(argv=None):
    from experiments import cli
    args = build_parser().parse_args(argv)
    cli.check_image_size('resnet152', args.image_size)
    print('{} px, batch {} per replica, 2 replicas, {} measured iterations '
          'x {} rounds (median), {} cores'.format(
              args.image_size, args.batch, args.iterations, args.rounds,
              os.cpu_count()), flush=True)
    if 'resnet152' in args.parts:
        with tempfile.TemporaryDirectory(prefix='cgdp-stage-path-') as old:
            try:
                export_revision(args.stage_rev, old)
            except RuntimeError as error:
                cli.fail(str(error))
            variants = [('stages (rev {}, 1 stage/chunk)'.format(
                args.stage_rev), _spec(args, variant='cgdp', net='resnet152',
                                       chunking='stages:1'), old)]
            for chunking in args.chunkings:
                variants.append(('readiness ({})'.format(chunking), _spec(
                    args, variant='cgdp', net='resnet152',
                    chunking=chunking), ROOT))
            medians = compare(variants, args)
        base_time, base_exposed, _ = medians[variants[0][0]]
        for label, (seconds, exposed, chunks) in medians.items():
            print('[resnet152] {}: {:.3f} s/iteration, exposed sync {:.4f} '
                  's, {} chunks; time / stage path {:.3f} (target <= 1.02), '
                  'exposed / stage path {:.3f} (target <= 1)'.format(
                      label, seconds, exposed, chunks, seconds / base_time,
                      exposed / base_exposed if base_exposed else
                      float('nan')), flush=True)
    if 'resnet50' in args.parts:
        variants = [
            ('ParallelUpdater', _spec(args, variant='parallel',
                                      net='resnet50-chainer'), ROOT),
            ('CGDP', _spec(args, variant='cgdp', net='resnet50-chainer',
                           chunking='default'), ROOT)]
        medians = compare(variants, args)
        print('[resnet50] L.ResNet50Layers (no stages), 2 replicas: '
              'ParallelUpdater {:.3f} s, CGDP {:.3f} s ({} chunks, exposed '
              'sync {:.4f} s), CGDP / Parallel = {:.3f}'.format(
                  medians['ParallelUpdater'][0], medians['CGDP'][0],
                  medians['CGDP'][2], medians['CGDP'][1],
                  medians['CGDP'][0] / medians['ParallelUpdater'][0]),
              flush=True)


if __name__ == '__main__':
    main()
