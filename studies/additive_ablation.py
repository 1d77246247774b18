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
epochs-to-target is the engine's: the power-law fit of its error against epochs, with its 95%
interval (summary.json's speedup analysis; an interval whose coverage was not measured in its
conditions says why).

Cost: 12 configurations at 8, 12, 16, 24 and 32 epochs (92 epochs in all) take 12 x 92 / 9.9 x
3.83 s = 427 A100-seconds per run each; at n = 50 per point 5.9 A100-hours; time is proportional
to --runs and the sum of --epochs. How many runs a given precision needs: run a few, then read
each curve's interval in report.md (its width shrinks about as 1 / sqrt(runs)).
"""
import sys

import matplotlib
import numpy as np

from paper import parse, run, shown, write_table

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


def epochs_to_target(summary, base):
    """The engine's epochs to the target of a configuration's curve, or None."""
    speedup = summary['speedup']
    curve = speedup.get('curves', {}).get(base, {}) if isinstance(speedup, dict) else {}
    return curve.get('epochs_to_target')


def estimate(result):
    return None if result is None else result.get('estimate')


def main(argv):
    args = parse(__doc__.splitlines()[0], 50, argv, options)
    found = run(args, configs(args))
    if found is None:
        return
    summary = found[1]
    full = epochs_to_target(summary, 'airbench94')
    baseline = epochs_to_target(summary, 'whitened-baseline')
    lines = [f'Epochs to {args.target:.0%} (95% CI): airbench94 {shown(full)}, the '
             f'whitened baseline {shown(baseline)}.', '',
             '| feature | epochs saved, added to the whitened baseline | epochs added, removed '
             'from airbench94 |', '|---|---|---|']
    bars = {}
    for feature in FEATURES:
        added = epochs_to_target(summary, f'baseline-plus-{config_name(feature)}')
        removed = epochs_to_target(summary, f'airbench94-minus-{config_name(feature)}')
        saved = difference(estimate(baseline), estimate(added))
        cost = difference(estimate(removed), estimate(full))
        bars[feature] = (saved, cost)
        lines.append(f"| {feature} | {'' if saved is None else f'{saved:.1f}'} (with it: "
                     f"{shown(added)}) | {'' if cost is None else f'{cost:.1f}'} (without it: "
                     f'{shown(removed)}) |')
    plot(args.study_dir, bars)
    write_table(args, 'Training speedups accumulate additively', [
        *lines, '', '![additive](additive.png)'])


def difference(first, second):
    return None if first is None or second is None else first - second


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
