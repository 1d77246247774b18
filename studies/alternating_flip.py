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

from paper import parse, run, shown, write_table
from studylib import analysis
from studylib.tables import read_study

CUTOUT = {'no': 0, 'yes': 12}
METRICS = {'No': 'val_acc', 'Yes': 'accuracy'}  # TTA: the plain accuracy, or the TTA accuracy


def options(parser):
    parser.add_argument('--script', default='airbench94')
    parser.add_argument('--epochs', default='10,20,40,80', help='the epoch counts (3 or more '
                        'for the speedups)')
    parser.add_argument('--cutout', default='no,yes', help='Cutout settings: no, yes or both')
    parser.add_argument('--flips', default='random,none,alternating', help='random first: the '
                        "paper's baseline, that of the speedups here and in report.md")


def flips(args):
    """The flip options with random flip first (the baseline of every comparison and speedup)."""
    given = args.flips.split(',')
    return sorted(given, key=lambda flip: flip != 'random')


def configs(args):
    flags = [args.script, '--grid', f'opt.train_epochs={args.epochs}']
    for cutout in args.cutout.split(','):
        for flip in flips(args):
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
    flips = [flip for flip in ('none', 'random', 'alternating') if flip in args.flips.split(',')]
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
    """Alternating over random flip, per Cutout setting, with TTA and without: the engine's
    effective speedups (studylib.analysis.speedup_analysis) against random flip's curve."""
    configs = read_study(args.study_dir).configs
    baselines = {f'cutout-{cutout}-alternating': f'cutout-{cutout}-random'
                 for cutout in args.cutout.split(',')}
    found = {tta: analysis.speedup_analysis(runs, configs, None, metric, baselines)
             for tta, metric in METRICS.items()}
    lines = ['| Cutout | Epochs | Speedup [95% CI] | Speedup (w/ TTA) [95% CI] |',
             '|---|---|---|---|']
    for cutout in args.cutout.split(','):
        for epochs in epochs_list:
            cells = [shown(speedup_of(found[tta], f'cutout-{cutout}-alternating', epochs),
                           scale=100, unit='%') for tta in METRICS]
            lines.append(f'| {cutout.capitalize()} | {epochs:g} | ' + ' | '.join(cells) + ' |')
    return lines + misfit_notes(found)


def speedup_of(found, label, epochs):
    curve = found.get('curves', {}).get(label, {})
    return curve.get('speedup', {}).get(str(float(epochs))) if 'reason' not in found else found


def misfit_notes(found):
    """A line for each random-flip curve whose power law stopped at a bound (or fit none): the
    speedups measured against it are not measurements."""
    notes = []
    for tta, section in found.items():
        for label, curve in section.get('curves', {}).items():
            if not label.endswith('-random'):
                continue
            fit = curve.get('fit')
            if fit is None or fit['at_bounds']:
                why = curve.get('fit_reason') or f"the fit stopped at the bound of " \
                    f"{', '.join(fit['at_bounds'])}"
                notes += ['', f'Random flip, {label}, TTA {tta.lower()}: {why}; no power law '
                          'within the bounds describes the curve, so the speedups against it are '
                          'not measurements (longer schedules: see the docstring).']
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
                  "random flip's mean errors; 95% intervals of studylib.stats.fits)", '',
                  *speedup_table(runs, args, epochs_list)]
    write_table(args, 'Alternating flip against random flip', lines)


if __name__ == '__main__':
    main(sys.argv[1:])
