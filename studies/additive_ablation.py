"""The paper's additive-ablation figure (fig:additive): the epochs to 94% that each feature saves
when added to the whitened baseline, against the epochs it costs when removed from airbench94.

    python studies/additive_ablation.py --study-dir results/ablation -- --data-dir data/cifar10
    torchrun --nproc_per_node=8 studies/additive_ablation.py --study-dir results/ablation

The features and their switches in airbench94's hyp: identity init (net.identity_init), the 64x
lr of the BatchNorm biases (opt.bias_scaler, 1 = off), Lookahead (opt.lookahead_every, 0 = off),
multi-crop TTA (net.tta_level 2; off = 1, mirror only) and alternating flip (aug.flip, off =
random). The whitened baseline is airbench94 with all five off and whitening on; the paper's
baseline also had its own tuned lr, momentum and schedule, which this study keeps at
airbench94's. Each configuration is trained at every epoch count of --epochs, and its
epochs-to-target comes from the power-law fit of its error against epochs (with a 95% bootstrap
interval over runs).

Cost: 12 configurations at 8, 12, 16, 24 and 32 epochs (92 epochs in all) take 12 x 92 / 9.9 x
3.83 s = 427 A100-seconds per run each; at n = 50 per point, enough to place epochs-to-94% within
about half an epoch, 5.9 A100-hours; time is proportional to --runs and the sum of --epochs.
"""
import sys

import matplotlib
import numpy as np

from paper import parse, run, write_table
from studylib.fits import bootstrap_epochs_to_accuracy
from studylib.stats import RESAMPLES

FEATURES = {  # name: (the switch on, the switch off)
    'identity init': ('net.identity_init=True', 'net.identity_init=False'),
    'BatchNorm-bias lr x64': ('opt.bias_scaler=64.0', 'opt.bias_scaler=1.0'),
    'Lookahead': ('opt.lookahead_every=5', 'opt.lookahead_every=0'),
    'multi-crop TTA': ('net.tta_level=2', 'net.tta_level=1'),
    'alternating flip': ('aug.flip=alternating', 'aug.flip=random'),
}


def options(parser):
    parser.add_argument('--epochs', default='8,12,16,24,32', help='the epoch counts (3 or more)')
    parser.add_argument('--target', type=float, default=0.94)


def config_name(feature):
    return feature.replace(' ', '-')


def configs(args):
    baseline = [off for _, off in FEATURES.values()]
    flags = ['airbench94', '--grid', f'opt.train_epochs={args.epochs}', '--target', str(args.target),
             '--config', 'airbench94', '--config', 'whitened-baseline', *baseline]
    for feature, (on, off) in FEATURES.items():
        flags += ['--config', f'airbench94-minus-{config_name(feature)}', off,
                  '--config', f'baseline-plus-{config_name(feature)}',
                  *[o for o in baseline if o != off], on]
    return flags


def epochs_to_target(runs, base, target):
    curve = {e: list(group['accuracy']) for e, group in
             runs[runs['base'] == base].groupby('opt.train_epochs')}
    if len(curve) < 3:
        return None
    try:
        return bootstrap_epochs_to_accuracy(curve, target, resamples=RESAMPLES)
    except ValueError:
        return None


def shown(result):
    if result is None:
        return 'no fit'
    return f'{result.estimate:.1f} [{result.low:.1f}, {result.high:.1f}]'


def main(argv):
    args = parse(__doc__.splitlines()[0], 50, argv, options)
    found = run(args, configs(args))
    if found is None:
        return
    runs = found[0]
    full = epochs_to_target(runs, 'airbench94', args.target)
    baseline = epochs_to_target(runs, 'whitened-baseline', args.target)
    lines = [f'Epochs to {args.target:.0%} (95% bootstrap CI): airbench94 {shown(full)}, the '
             f'whitened baseline {shown(baseline)}.', '',
             '| feature | epochs saved, added to the whitened baseline | epochs added, removed '
             'from airbench94 |', '|---|---|---|']
    bars = {}
    for feature in FEATURES:
        added = epochs_to_target(runs, f'baseline-plus-{config_name(feature)}', args.target)
        removed = epochs_to_target(runs, f'airbench94-minus-{config_name(feature)}', args.target)
        saved = None if added is None or baseline is None else baseline.estimate - added.estimate
        cost = None if removed is None or full is None else removed.estimate - full.estimate
        bars[feature] = (saved, cost)
        lines.append(f"| {feature} | {'' if saved is None else f'{saved:.1f}'} (with it: "
                     f"{shown(added)}) | {'' if cost is None else f'{cost:.1f}'} (without it: "
                     f'{shown(removed)}) |')
    plot(args.study_dir, bars)
    write_table(args, 'Training speedups accumulate additively', [
        *lines, '', '![additive](additive.png)'])


def plot(study_dir, bars):
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 3.5))
    positions = np.arange(len(bars))
    for offset, index, label in ((-0.2, 0, 'saved when added to the whitened baseline'),
                                 (0.2, 1, 'added when removed from airbench94')):
        axes.bar(positions + offset, [np.nan if v[index] is None else v[index]
                                      for v in bars.values()], 0.4, label=label)
    axes.set_xticks(positions, list(bars), rotation=15)
    axes.set_ylabel('epochs to target')
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(f'{study_dir}/additive.png', dpi=120)
    plt.close(figure)


if __name__ == '__main__':
    main(sys.argv[1:])
