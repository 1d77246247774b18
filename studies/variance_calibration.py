"""The paper's variance table (tab:variance): for airbench94 at 1x and 2x its epochs, and at 1.5x
its epochs and widths, with and without TTA: mean accuracy, test-set standard deviation,
distribution-wise standard deviation (Jordan 2024) and class-aggregated calibration error
(Jiang et al. 2022), from every run's saved test logits.

    python studies/variance.py --study-dir results/variance -- --data-dir data/cifar10
    torchrun --nproc_per_node=8 studies/variance.py --study-dir results/variance --runs 10000

Cost: the paper ran n = 10,000 per setting: 10,000 x (1 + 2 + 1.5 x 2.25) x 3.83 s = 68 A100-hours
(a 1.5x wider network costs about 2.25x per epoch). The default n = 1000 takes 6.8; the
distribution-wise std needs n in the hundreds to be told from 0 at these levels (its standard
error shrinks as 1/n). Time is proportional to --runs; --base-epochs and --base-widths scale the
settings down for a quick look.
"""
import sys

from paper import parse, run, write_table
from studylib import variance

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


def main(argv):
    args = parse(__doc__.splitlines()[0], 1000, argv, options)
    found = run(args, configs(args))
    if found is None:
        return
    runs, arrays = found
    labels = arrays['test_labels']
    lines = ['| Epochs | Width | TTA | n | Mean accuracy | Test-set stddev | Dist-wise stddev | '
             'CACE |', '|---|---|---|---|---|---|---|---|']
    for tta, key in (('No', 'logits_plain'), ('Yes', 'logits')):
        for name, (epochs, width) in SETTINGS.items():
            keys = [(name, run) for run in runs.loc[runs['config'] == name, 'run']]
            if len(keys) < 2:
                continue
            predictions = [arrays[key][k].argmax(1) for k in keys]
            correct = [p == labels for p in predictions]
            accuracies = [c.mean() for c in correct]
            lines.append(
                f'| {epochs:g}x | {width:g}x | {tta} | {len(keys)} | '
                f'{100 * sum(accuracies) / len(keys):.2f}% | '
                f'{100 * variance.test_set_std(accuracies):.3f}% | '
                f'{100 * variance.distribution_wise_std(correct):.3f}% | '
                f'{variance.class_aggregated_calibration_error(predictions, labels):.4f} |')
    write_table(args, 'Variance and class-wise calibration of airbench94', lines)


if __name__ == '__main__':
    main(sys.argv[1:])
