"""The paper's variance table (tab:variance): for airbench94 at 1x and 2x its epochs, and at 1.5x
its epochs and widths, with and without TTA: mean accuracy, test-set standard deviation,
distribution-wise standard deviation (Jordan 2024) and class-aggregated calibration error
(Jiang et al. 2022), from every run's saved test logits.

    python studies/variance_calibration.py --study-dir results/variance -- --data-dir data/cifar10
    torchrun --nproc_per_node=8 studies/variance_calibration.py --study-dir results/variance \
        --runs 10000

Cost: the paper ran n = 10,000 per setting: 10,000 x (1 + 2 + 1.5 x 2.25) x 3.83 s = 68 A100-hours
(a 1.5x wider network costs about 2.25x per epoch). The default n = 1000 takes 6.8. Every figure
comes with its 95% interval (the engine's EnsembleTally.summary): a standard deviation between
runs is known to within about 1 / sqrt(2 (n - 1)) of itself (7% at n = 100, 2% at n = 1000), and
the distribution-wise std, the square root of a small difference of two variances, needs n in the
thousands to be told from 0 at the paper's levels. Time is proportional to --runs; --base-epochs
and --base-widths scale the settings down for a quick look.
"""
import sys

from paper import parse, run, write_table

SETTINGS = {  # name: (epochs factor, width factor)
    'epochs-1x': (1, 1),
    'epochs-2x': (2, 1),
    'epochs-1.5x-width-1.5x': (1.5, 1.5),
}


def options(parser):
    parser.add_argument('--base-epochs', type=float, default=9.9, help="the 1x epochs "
                        "(airbench94's)")
    parser.add_argument('--base-widths', default='64,256,256', help="the 1x widths of the three "
                        "blocks (airbench94's)")


def configs(args):
    flags = ['airbench94', '--save-logits']
    base_widths = [int(width) for width in args.base_widths.split(',')]
    for name, (epochs, width) in SETTINGS.items():
        widths = {f'block{i + 1}': int(width * channels) for i, channels in enumerate(base_widths)}
        flags += ['--config', name, f'opt.train_epochs={epochs * args.base_epochs:g}',
                  f'net.widths={widths}'.replace(' ', '')]
    return flags


def interval(entry, digits=3):
    low, high = entry
    return f'[{100 * low:.{digits}f}, {100 * high:.{digits}f}]'


def row(epochs, width, tta, entry):
    """One line of the table from the engine's variance entry (percent, with 95% intervals)."""
    dist = entry['distribution_wise_std']
    dist = 'below 0' if dist is None else f'{100 * dist:.3f}%'
    calibration = entry['calibration']
    return (f"| {epochs:g}x | {width:g}x | {tta} | {entry['n']} | {100 * entry['mean']:.2f}% | "
            f"{100 * entry['test_set_std']:.3f}% {interval(entry['test_set_std_ci'])} | {dist} "
            f"{interval(entry['distribution_wise_std_ci'])} | {calibration['estimate']:.4f} "
            f"[{calibration['ci_low']:.4f}, {calibration['ci_high']:.4f}] | "
            f"{calibration['calibrated_level']:.4f} |")


def main(argv):
    args = parse(__doc__.splitlines()[0], 1000, argv, options)
    found = run(args, configs(args))
    if found is None:
        return
    variance = found[1]['variance']
    if 'reason' in variance:
        sys.exit(f"error: no variance analysis: {variance['reason']}")
    lines = ['| Epochs | Width | TTA | n | Mean accuracy | Test-set stddev [95% CI] | '
             'Dist-wise stddev [95% CI] | CACE [95% CI] | CACE if calibrated |',
             '|---|---|---|---|---|---|---|---|---|']
    for tta, key in (('No', 'no_tta'), ('Yes', 'tta')):
        for name, (epochs, width) in SETTINGS.items():
            entry = variance.get(name, {}).get(key)
            if entry is None:
                continue
            if 'reason' in entry:
                lines.append(f"| {epochs:g}x | {width:g}x | {tta} | not computed: "
                             f"{entry['reason']} |")
                continue
            lines.append(row(epochs, width, tta, entry))
    write_table(args, 'Variance and class-wise calibration of airbench94', [
        *lines, '', 'CACE as the engine computes it (docs/studies.md): the split-half estimate, '
        'pairs binned by 50 runs\' vote shares in up to 15 bins of nearly equal mass and scored '
        'against the other half of the runs, so that it means the same at any number of runs '
        'from 100; "if calibrated": its mean for labels drawn from the ensemble\'s own vote '
        "shares (a finite test set's floor)."])


if __name__ == '__main__':
    main(sys.argv[1:])
