"""Coverage of the study statistics' 95% intervals, measured on simulated studies whose truth is
known: how often each interval holds the true value, per method and runs per cell.

Truths: test error = 0.03 + 0.45 * epochs^-0.75 on the grid 5, 10, 20, 40 epochs ('law A', the
review's), and the power law fitted to the paper's random-flip accuracies at 10, 20, 40, 80 epochs
(tab:altflip_cifar10, no Cutout, no TTA: 'paper'); run noise 0.15 points (the paper's run-to-run
std), normal, or with a tail (one run in 20 a further 0.5 points lower). A compared configuration
is exactly 25% faster: its accuracy at E epochs is the truth's at 1.25 E. Means and comparisons
use 94% +- the same noise; paired runs correlate by 0.5.

Methods: 'Monte Carlo t' is what study uses (studylib.fits: cell means drawn from their Student-t
distributions); 'bootstrap' the percentile bootstrap of runs it replaced (1000 resamples).
Each cell prints the coverage over all simulated studies (an open interval counts as [low, inf),
an undefined one as a miss) and, for study's intervals, the share it flagged `reliable: False`.

--calibration prints instead the class-aggregated calibration error of simulated ensembles (10,000
examples, 10 classes; runs predict from each example's Dirichlet probabilities pi): calibrated
(labels drawn from pi, or from the ensemble's own vote shares) and over-confident (labels from
pi^0.6, normalized), at 100 and 1000 runs, in 15 equal-mass bins and with every vote level its own
bin (the former default).

Usage: python tools/coverage.py [--studies 400] [--runs 2,3,5,10,25] [--calibration]
"""
import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from studylib import fits, inference, variance  # noqa: E402
from tools.paper_speedups import RANDOM, accuracies  # noqa: E402

NOISE = 0.0015  # run-to-run standard deviation, as a fraction
TAIL = (0.05, 0.005)  # the tail's share of runs and how much lower they are
SPEEDUP = 0.25  # the compared configuration's true speedup
CONFIDENCE = 0.95


def law_a():
    return fits.PowerLaw(a=-0.75, b=0.45, c=0.03), (5, 10, 20, 40)


def law_paper():
    epochs = (10, 20, 40, 80)
    return fits.fit_power_law(epochs, [1 - a for a in accuracies(False, False, RANDOM)]), epochs


def noisy(rng, mean, runs, tail=False):
    values = mean + rng.normal(0, NOISE, runs)
    if tail:
        values -= TAIL[1] * (rng.random(runs) < TAIL[0])
    return values


def covers(entry, truth, low='ci_low', high='ci_high'):
    if entry[low] is None and entry[high] is None:
        return False
    return (entry[low] is None or entry[low] <= truth) and \
        (entry[high] is None or truth <= entry[high])


def bootstrap(cells, statistic, rng, resamples=1000):
    """The percentile bootstrap of runs within cells that study used before (the comparison)."""
    means = np.stack([cell[rng.integers(0, cell.size, (resamples, cell.size))].mean(1)
                      for cell in cells], axis=1)
    values = statistic(means)
    values = np.sort(values[~np.isnan(values)])
    if not values.size:
        return dict(ci_low=None, ci_high=None)
    tail = (1 - CONFIDENCE) / 2
    low = values[int(np.floor(tail * values.size))]
    high = values[min(int(np.ceil((1 - tail) * values.size)) - 1, values.size - 1)]
    return dict(ci_low=float(low), ci_high=float(high) if np.isfinite(high) else None)


def epochs_case(law, grid, target):
    truth = law.epochs_for_error(1 - target)

    def simulate(rng, runs):
        cells = {e: noisy(rng, 1 - law.error_at(e), runs) for e in grid}
        ours = fits.epochs_to_accuracy_interval(cells, target, seed=int(rng.integers(1 << 31)))

        def statistic(means):
            a, b, c, _ = fits.fit_power_laws(grid, 1 - means)
            return fits._epochs_for_errors(a, b, c, 1 - target)
        return ours, bootstrap([cells[e] for e in grid], statistic, rng)
    return truth, simulate


def speedup_case(law, grid, epochs):
    def simulate(rng, runs):
        baseline = {e: noisy(rng, 1 - law.error_at(e), runs) for e in grid}
        compared = noisy(rng, 1 - law.error_at((1 + SPEEDUP) * epochs), runs)
        ours = fits.effective_speedup_interval(baseline, compared, epochs,
                                               seed=int(rng.integers(1 << 31)))

        def statistic(means):
            a, b, c, _ = fits.fit_power_laws(grid, 1 - means[:, :-1])
            return fits._epochs_for_errors(a, b, c, 1 - means[:, -1]) / epochs - 1
        return ours, bootstrap([*(baseline[e] for e in grid), compared], statistic, rng)
    return SPEEDUP, simulate


def mean_case(tail):
    truth = 0.94 - (TAIL[0] * TAIL[1] if tail else 0)

    def simulate(rng, runs):
        entry = inference.target_test(noisy(rng, 0.94, runs, tail), 0.94)
        return entry, None
    return truth, simulate


def compare_case(paired):
    difference = 0.001

    def simulate(rng, runs):
        shared = rng.normal(0, NOISE * np.sqrt(0.5), runs) if paired else 0
        scale = np.sqrt(0.5) if paired else 1
        a = 0.94 + shared + rng.normal(0, NOISE * scale, runs)
        b = 0.94 + difference + shared + rng.normal(0, NOISE * scale, runs)
        return inference.compare(a, b, paired=paired), None
    return difference, simulate


def cases():
    """{name: (truth, simulate, closed form)}: the closed-form intervals are simulated 10 times as
    often (they cost nothing), so that their coverage is known to about 0.3 points."""
    a_law, a_grid = law_a()
    paper, paper_grid = law_paper()
    closed_form = {
        'mean (Student t)': mean_case(False),
        'mean (Student t), runs with a tail': mean_case(True),
        "compare, Welch's t": compare_case(False),
        'compare, paired t (correlation 0.5)': compare_case(True)}
    return {**{name: (*case, True) for name, case in closed_form.items()}, **{
        name: (*case, False) for name, case in {
        'epochs to 94%, law A': epochs_case(a_law, a_grid, 0.94),
        'speedup at 10 epochs, law A': speedup_case(a_law, a_grid, 10),
        'speedup at 40 epochs, law A (extrapolated)': speedup_case(a_law, a_grid, 40),
        'epochs to 93.9%, paper': epochs_case(paper, paper_grid, 0.939),
        'speedup at 20 epochs, paper': speedup_case(paper, paper_grid, 20)}.items()}}


def coverage(simulate, truth, runs, studies, seed=0):
    """(coverage of study's interval, its share flagged unreliable, coverage of the bootstrap or
    None) over `studies` simulated studies."""
    rng = np.random.default_rng(seed)
    ours, flagged, theirs = 0, 0, 0
    for _ in range(studies):
        entry, baseline = simulate(rng, runs)
        ours += covers(entry, truth)
        flagged += entry.get('reliable', True) is False
        theirs += baseline is not None and covers(baseline, truth)
    return ours / studies, flagged / studies, None if baseline is None else theirs / studies


def ensemble(runs, labels_from, examples=10000, classes=10, seed=0):
    """(predictions, labels) of a simulated ensemble; labels_from: 'pi', 'votes' or 'pi^0.6'."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet(np.full(classes, 0.15), examples)
    predictions = np.minimum((rng.random((runs, examples, 1)) >
                              probabilities.cumsum(axis=1)[None]).sum(axis=2), classes - 1)
    if labels_from == 'votes':
        source = variance.ensemble_votes(predictions, classes) / runs
    else:
        source = probabilities ** (0.6 if labels_from == 'pi^0.6' else 1.0)
        source /= source.sum(axis=1, keepdims=True)
    labels = np.minimum((rng.random((examples, 1)) > source.cumsum(axis=1)).sum(axis=1),
                        classes - 1)
    return predictions, labels


def calibration_table():
    print('| ensemble | runs | 15 equal-mass bins [95% CI] | calibrated level (97.5%) | '
          'every level a bin |')
    print('|---|---|---|---|---|')
    for name, labels_from in (('calibrated (labels from pi)', 'pi'),
                              ("calibrated (labels from its votes)", 'votes'),
                              ('over-confident (labels from pi^0.6)', 'pi^0.6')):
        for runs in (100, 1000):
            predictions, labels = ensemble(runs, labels_from, seed=runs)
            result = variance.calibration_error(predictions, labels)
            per_level = variance.class_aggregated_calibration_error(predictions, labels,
                                                                    bins=None)
            print(f"| {name} | {runs} | {result['estimate']:.4f} [{result['ci_low']:.4f}, "
                  f"{result['ci_high']:.4f}] | {result['calibrated_level']:.4f} "
                  f"({result['calibrated_upper']:.4f}) | {per_level:.4f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--studies', type=int, default=400)
    parser.add_argument('--runs', default='2,3,5,10,25')
    parser.add_argument('--calibration', action='store_true')
    args = parser.parse_args(argv)
    if args.calibration:
        return calibration_table()
    counts = [int(n) for n in args.runs.split(',')]
    start = time.perf_counter()
    print(f'Coverage of nominal 95% intervals, {args.studies} simulated studies per cell '
          f'({10 * args.studies} for the closed-form ones); study\'s (share flagged reliable: '
          'False) / the former bootstrap\n')
    print('| quantity | ' + ' | '.join(f'n = {n}' for n in counts) + ' |')
    print('|---|' + '---|' * len(counts))
    for name, (truth, simulate, closed_form) in cases().items():
        cells = []
        for n in counts:
            ours, flagged, theirs = coverage(simulate, truth, n,
                                             args.studies * (10 if closed_form else 1))
            cell = f'{100 * ours:.1f}% ({100 * flagged:.0f}%)'
            cells.append(cell + ('' if theirs is None else f' / {100 * theirs:.1f}%'))
        print(f'| {name} | ' + ' | '.join(cells) + ' |', flush=True)
    print(f'\n{time.perf_counter() - start:.0f} s')


if __name__ == '__main__':
    main()
