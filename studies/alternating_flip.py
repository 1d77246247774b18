"""The paper's alternating-flip experiments on CIFAR-10: its table of raw accuracies
(tab:altflip_cifar10: no, random and alternating flip, with and without Cutout and TTA, at
10 to 80 epochs) and its table of effective speedups of alternating over random flip
(tab:altflip), from power-law fits of random flip's error against epochs.

    python studies/alternating_flip.py --study-dir results/flip -- --data-dir data/cifar10
    torchrun --nproc_per_node=8 studies/alternating_flip.py --study-dir results/flip
    python studies/alternating_flip.py --study-dir results/flip-96 --script airbench96 \\
        --cutout yes --flips random,alternating                      (the airbench96 rows)

Each run gives both TTA columns: its TTA accuracy and the plain accuracy of its final network
(the last epoch's evaluation, so leave per-epoch evaluation on). "Cutout" is airbench96's
12-pixel square added to airbench94.
Cost at the paper's n = 400: airbench94 takes 3.83 A100-seconds per 9.9 epochs, so one flip
option at 10+20+40+80 epochs is 400 x 150 / 9.9 x 3.83 s = 6.4 A100-hours; the whole table
(3 flips, 2 Cutout settings) 39 hours, or 26 without the no-flip column. --runs, --epochs and
--flips scale it: time is proportional to runs x the sum of the epochs x the flips.
"""
import sys

import numpy as np

from paper import parse, run, write_table
from studylib.fits import bootstrap_effective_speedup, fit_power_law
from studylib.stats import RESAMPLES

CUTOUT = {'no': 0, 'yes': 12}
METRICS = {'No': 'val_acc', 'Yes': 'accuracy'}  # TTA: the plain accuracy, or the TTA accuracy


def options(parser):
    parser.add_argument('--script', default='airbench94')
    parser.add_argument('--epochs', default='10,20,40,80', help='the epoch counts (3 or more '
                        'for the speedups)')
    parser.add_argument('--cutout', default='no,yes', help='Cutout settings: no, yes or both')
    parser.add_argument('--flips', default='none,random,alternating')


def configs(args):
    flags = [args.script, '--grid', f'opt.train_epochs={args.epochs}']
    for cutout in args.cutout.split(','):
        for flip in args.flips.split(','):
            flags += ['--config', f'cutout-{cutout}-{flip}', f'aug.flip={flip}',
                      f'aug.cutout={CUTOUT[cutout]}']
    return flags


def cell(runs, cutout, flip, epochs, metric):
    values = runs.loc[(runs['base'] == f'cutout-{cutout}-{flip}') &
                      (runs['opt.train_epochs'] == epochs), metric]
    if values.isna().any():
        sys.exit('error: the runs have no plain (no-TTA) accuracy: per-epoch evaluation was off '
                 '(--no-epoch-eval); run the study without it')
    return list(values)


def raw_table(runs, args, epochs_list):
    flips = args.flips.split(',')
    lines = ['| Epochs | Cutout | TTA | ' + ' | '.join(f.capitalize() for f in flips) + ' |',
             '|---|---|---|' + '---|' * len(flips)]
    for cutout in args.cutout.split(','):
        for tta, metric in METRICS.items():
            for epochs in epochs_list:
                means = [cell(runs, cutout, flip, epochs, metric) for flip in flips]
                shown = [f'{100 * np.mean(m):.4f} (n {len(m)})' if m else '' for m in means]
                lines.append(f"| {epochs:g} | {cutout.capitalize()} | {tta} | "
                             + ' | '.join(shown) + ' |')
    return lines


def speedup_table(runs, args, epochs_list):
    lines = ['| Cutout | Epochs | Speedup [95% CI] | Speedup (w/ TTA) [95% CI] |',
             '|---|---|---|---|']
    for cutout in args.cutout.split(','):
        for epochs in epochs_list:
            shown = []
            for metric in METRICS.values():
                baseline = {e: cell(runs, cutout, 'random', e, metric) for e in epochs_list}
                alternating = cell(runs, cutout, 'alternating', epochs, metric)
                if not alternating or not all(baseline.values()):
                    shown.append('')
                    continue
                try:
                    speedup = bootstrap_effective_speedup(baseline, alternating, epochs,
                                                          resamples=RESAMPLES)
                except ValueError as error:  # random flip's errors admit no power law
                    shown.append(f'no fit ({error})')
                    continue
                shown.append(f'{100 * speedup.estimate:.1f}% [{100 * speedup.low:.1f}, '
                             f'{100 * speedup.high:.1f}]')
            lines.append(f'| {cutout.capitalize()} | {epochs:g} | ' + ' | '.join(shown) + ' |')
    return lines + misfit_notes(runs, args, epochs_list)


def misfit_notes(runs, args, epochs_list):
    """A line for each random-flip curve whose power law stopped at a bound: the speedups
    measured against it are not measurements."""
    notes = []
    for cutout in args.cutout.split(','):
        for tta, metric in METRICS.items():
            means = [np.mean(cell(runs, cutout, 'random', e, metric)) for e in epochs_list]
            try:
                law = fit_power_law(epochs_list, [1 - m for m in means])
            except ValueError:
                continue
            if law.at_bounds:
                miss = np.abs(1 - law.error_at(epochs_list) - np.array(means)).max()
                notes += ['', f'Random flip, Cutout {cutout}, TTA {tta.lower()}: the power law '
                          f'stopped at the bound of {", ".join(law.at_bounds)} and misses its '
                          f'means by up to {100 * miss:.2f} points; no power law within the '
                          'bounds describes the curve, so the speedups against it are not '
                          'measurements (longer schedules: see the docstring).']
    return notes


def main(argv):
    args = parse(__doc__.splitlines()[0], 400, argv, options)
    found = run(args, configs(args))
    if found is None:
        return
    runs = found[0]
    epochs_list = sorted(float(e) for e in args.epochs.split(','))
    lines = [f'{args.script}: mean accuracy in percent', '', *raw_table(runs, args, epochs_list)]
    if {'random', 'alternating'} <= set(args.flips.split(',')) and len(epochs_list) >= 3:
        lines += ['', 'Effective speedup of alternating over random flip (power law fitted to '
                  "random flip's mean errors; 95% bootstrap intervals over runs)", '',
                  *speedup_table(runs, args, epochs_list)]
    write_table(args, 'Alternating flip against random flip', lines)


if __name__ == '__main__':
    main(sys.argv[1:])
