"""Coverage and width of the study statistics' intervals, and the rejection rates of their tests at
the boundary, measured on simulated studies whose truth is known.

The runs. Accuracy = the truth's mean + noise of 0.15 points between runs (the paper's run-to-run
std), normal ('normal', the law the methods assume) or with a tail ('tail', the misspecified law:
one run in 20 a further 0.5 points lower, so the mean is 0.025 points lower than the curve). A
study gives run i of every configuration and epoch count the same seeds, so its runs share a run
effect: a correlation of 0.5 between the cells of one run (0 where a row says "independent runs").

The fitted quantities. Test error = 0.03 + 0.45 * epochs^-0.75 on the grid 5, 10, 20, 40 epochs
('law A'); the power law fitted to the paper's random-flip accuracies at 10, 20, 40, 80 epochs
(tab:altflip_cifar10, no Cutout, no TTA: 'paper'); and a curve that is no power law, error =
0.055 + 0.25 * exp(-epochs / 6) on 5, 10, 20, 40 ('exponential'). A compared configuration is
exactly 25% faster: its accuracy at E epochs is the truth's at 1.25 E. 'study' is studylib.stats.fits'
interval (pooled variance, paired by seed); 'former' the one it replaced (each cell's mean drawn
alone from its own Student t). Both draw --draws times (the library's default is 4000; 2000 move
a 2.5% quantile by about 0.35% of the draws, which changes no coverage measurably).

The closed-form intervals: the mean's (two-sided Student t), the target claim's one-sided lower
bound, Welch's and the paired comparison, and the test-set std's chi-square interval, each
simulated 10 times as often (they cost nothing), so that their coverage is known to about 0.3
points.

Each cell of the coverage table: coverage (an open interval counts as [low, inf), an undefined
one as a miss), in brackets the share study flagged `reliable: False`, then the mean width of the
closed intervals (epochs, points of speedup, points of accuracy), and after the slash the former
method's coverage and width. --boundary prints the rejection rates of the tests where their null
hypothesis holds with equality (the size, at most 5% nominal) and the lack-of-fit test's power;
--calibration the class-aggregated calibration error of simulated ensembles (variance.py).

Usage: python tools/interval_coverage.py [--studies 400] [--runs 3,5,10,25] [--draws 2000] [--rows TEXT]
                                [--boundary] [--calibration]
"""
import argparse
import math
import os
import sys
import time

import numpy as np
from scipy import stats
from scipy.optimize import brentq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from studylib.stats import fits, inference, variance  # noqa: E402
from tools.paper_speedups import RANDOM, accuracies  # noqa: E402

NOISE = 0.0015  # run-to-run standard deviation, as a fraction
TAIL = (0.05, 0.005)  # the tail's share of runs and how much lower they are
CORRELATION = 0.5  # between the cells of one run (its seeds)
SPEEDUP = 0.25  # the compared configuration's true speedup
CONFIDENCE = 0.95
DRAWS = 2000
NOISES = ('normal', 'tail')


def shift(noise):
    """How much the tail lowers the mean accuracy."""
    return TAIL[0] * TAIL[1] if noise == 'tail' else 0.0


def noisy(rng, means, runs, noise, correlation=CORRELATION):
    """runs x cells of accuracies: the cells' means, a run effect shared by the cells of a run,
    each run's own noise, and the tail."""
    means = np.atleast_1d(np.asarray(means, dtype=float))
    values = (means + rng.normal(0, NOISE * math.sqrt(correlation), (runs, 1))
              + rng.normal(0, NOISE * math.sqrt(1 - correlation), (runs, means.size)))
    if noise == 'tail':
        values -= TAIL[1] * (rng.random(values.shape) < TAIL[0])
    return values


class Curve:
    """A true curve of error against epochs: a power law, or another function."""

    def __init__(self, error_at, grid):
        self.error_at, self.grid = error_at, grid

    def epochs_for_error(self, error):
        """The epochs at which the curve reaches `error` (between 0.1 and 10,000)."""
        return float(np.exp(brentq(lambda log_epochs: self.error_at(np.exp(log_epochs)) - error,
                                   math.log(0.1), math.log(1e4), xtol=1e-12)))


def law_a():
    law = fits.PowerLaw(a=-0.75, b=0.45, c=0.03)
    return Curve(law.error_at, (5, 10, 20, 40))


def law_paper():
    grid = (10, 20, 40, 80)
    law = fits.fit_power_law(grid, [1 - a for a in accuracies(False, False, RANDOM)])
    return Curve(law.error_at, grid)


def exponential():
    return Curve(lambda epochs: 0.055 + 0.25 * np.exp(-np.asarray(epochs, dtype=float) / 6),
                 (5, 10, 20, 40))


def quantile_interval(values):
    """The central CONFIDENCE interval of Monte Carlo values as studylib.stats.fits takes it (nan:
    dropped; inf above: open)."""
    kept = np.sort(values[~np.isnan(values)])
    if not kept.size:
        return dict(ci_low=None, ci_high=None)
    tail = (1 - CONFIDENCE) / 2
    low = kept[min(int(math.floor(tail * kept.size)), kept.size - 1)]
    high = kept[min(int(math.ceil((1 - tail) * kept.size)) - 1, kept.size - 1)]
    return dict(ci_low=float(low) if math.isfinite(low) else None,
                ci_high=float(high) if math.isfinite(high) else None)


def former_interval(cells, statistic, rng, draws):
    """The interval study gave before: each cell's true mean drawn alone from
    mean + s / sqrt(n) * t(n - 1)."""
    means = np.stack([cell.mean() + cell.std(ddof=1) / math.sqrt(cell.size)
                      * rng.standard_t(cell.size - 1, draws) for cell in cells], axis=1)
    return quantile_interval(statistic(means))


def epochs_statistic(grid, error):
    def statistic(means):
        a, b, c, _ = fits.fit_power_laws(grid, 1 - means)
        return fits._epochs_for_errors(a, b, c, error)
    return statistic


def speedup_statistic(grid, epochs):
    def statistic(means):
        a, b, c, _ = fits.fit_power_laws(grid, 1 - means[:, :-1])
        return fits._epochs_for_errors(a, b, c, 1 - means[:, -1]) / epochs - 1
    return statistic


def epochs_case(curve, target, correlation=CORRELATION):
    def case(noise):
        truth = curve.epochs_for_error(1 - target - shift(noise))

        def simulate(rng, runs, draws):
            table = noisy(rng, 1 - curve.error_at(np.array(curve.grid)), runs, noise,
                          correlation)
            cells = list(table.T)
            ours = fits.epochs_to_accuracy_interval(
                dict(zip(curve.grid, cells)), target, draws=draws,
                seed=int(rng.integers(1 << 31)), paired=correlation > 0)
            return ours, former_interval(cells, epochs_statistic(curve.grid, 1 - target), rng,
                                         draws)
        return truth, simulate
    return case


def speedup_case(curve, epochs):
    def case(noise):
        def simulate(rng, runs, draws):
            truths = 1 - curve.error_at(np.array([*curve.grid, (1 + SPEEDUP) * epochs]))
            table = noisy(rng, truths, runs, noise)
            cells = list(table.T)
            ours = fits.effective_speedup_interval(
                dict(zip(curve.grid, cells[:-1])), cells[-1], epochs, draws=draws,
                seed=int(rng.integers(1 << 31)), paired=True)
            return ours, former_interval(cells, speedup_statistic(curve.grid, epochs), rng,
                                         draws)
        return SPEEDUP, simulate
    return case


def mean_case(noise):
    def simulate(rng, runs, draws):
        return inference.describe(noisy(rng, 0.94, runs, noise).ravel()), None
    return 0.94 - shift(noise), simulate


def target_bound_case(noise):
    def simulate(rng, runs, draws):
        entry = inference.target_test(noisy(rng, 0.94, runs, noise).ravel(), 0.94)
        return dict(entry, ci_low=entry['lower_bound'], ci_high=None), None
    return 0.94 - shift(noise), simulate


def compare_case(paired):
    def case(noise):
        def simulate(rng, runs, draws):
            table = noisy(rng, [0.94, 0.941], runs, noise, CORRELATION if paired else 0.0)
            return inference.compare(table[:, 0], table[:, 1], paired=paired), None
        return 0.001, simulate
    return case


def std_case(noise):
    truth = math.sqrt(NOISE ** 2 + (TAIL[0] * (1 - TAIL[0]) * TAIL[1] ** 2
                                    if noise == 'tail' else 0))

    def simulate(rng, runs, draws):
        values = noisy(rng, 0.94, runs, noise).ravel()
        low, high = variance.sample_variance_interval(values, CONFIDENCE)
        return dict(ci_low=math.sqrt(low), ci_high=math.sqrt(high)), None
    return truth, simulate


def cases():
    """{name: (case(noise) -> (truth, simulate), closed form, width scale, noises)}; simulate(rng,
    runs, draws) gives (study's interval, the former one or None)."""
    a, paper = law_a(), law_paper()
    closed = {
        'mean (Student t)': (mean_case, 100),
        'target claim: one-sided 95% lower bound (width: mean - bound)': (target_bound_case, 100),
        "compare, Welch's t (independent runs)": (compare_case(False), 100),
        'compare, paired t': (compare_case(True), 100),
        'test-set std, chi-square (assumes normal runs)': (std_case, 100)}
    fitted = {
        'epochs to 94%, law A': (epochs_case(a, 0.94), 1),
        'epochs to 94%, law A, independent runs (unpaired)': (epochs_case(a, 0.94, 0.0), 1),
        'speedup at 10 epochs, law A': (speedup_case(a, 10), 100),
        'speedup at 40 epochs, law A (extrapolated)': (speedup_case(a, 40), 100),
        'epochs to 93.9%, paper': (epochs_case(paper, 0.939), 1),
        'speedup at 20 epochs, paper': (speedup_case(paper, 20), 100)}
    return {**{name: (case, True, scale, NOISES) for name, (case, scale) in closed.items()},
            **{name: (case, False, scale, NOISES) for name, (case, scale) in fitted.items()},
            'epochs to 94%, exponential (no power law)': (epochs_case(exponential(), 0.94), False,
                                                          1, ('normal',))}


def covers(entry, truth):
    if entry['ci_low'] is None and entry['ci_high'] is None:
        return False
    return (entry['ci_low'] is None or entry['ci_low'] <= truth) and \
        (entry['ci_high'] is None or truth <= entry['ci_high'])


def width(entry):
    if entry['ci_low'] is None or entry['ci_high'] is None:
        return math.nan
    return entry['ci_high'] - entry['ci_low']


def coverage(simulate, truth, runs, studies, seed=0, draws=DRAWS):
    """{'ours': coverage, 'flagged': share flagged unreliable, 'width': mean width of the closed
    intervals, 'former': coverage or None, 'former_width'} over `studies` simulated studies."""
    rng = np.random.default_rng(seed)
    found = dict(ours=[], flagged=[], width=[], former=[], former_width=[])
    for _ in range(studies):
        entry, former = simulate(rng, runs, draws)
        if 'lower_bound' in entry:  # a one-sided bound: its width is its distance to the mean
            entry = dict(entry, ci_high=entry['mean'] if entry['lower_bound'] is not None
                         else None)
            found['ours'].append(entry['ci_low'] is not None and entry['ci_low'] <= truth)
        else:
            found['ours'].append(covers(entry, truth))
        found['flagged'].append(entry.get('reliable', True) is False)
        found['width'].append(width(entry))
        if former is not None:
            found['former'].append(covers(former, truth))
            found['former_width'].append(width(former))
    return {key: (float(np.nanmean(values)) if values and not np.isnan(values).all() else None)
            for key, values in found.items()}


def coverage_table(args, counts):
    print(f'Coverage of nominal 95% intervals, {args.studies} simulated studies per cell '
          f'({10 * args.studies} for the closed-form ones), {args.draws} Monte Carlo draws: '
          "study's coverage (share flagged reliable: False) mean width / the former method's "
          'coverage and mean width\n')
    print('| quantity | runs | ' + ' | '.join(f'n = {n}' for n in counts) + ' |')
    print('|---|---|' + '---|' * len(counts))
    for name, (case, closed, scale, noises) in cases().items():
        if args.rows and args.rows not in name:
            continue
        for noise in noises:
            truth, simulate = case(noise)
            cells = []
            for n in counts:
                found = coverage(simulate, truth, n, args.studies * (10 if closed else 1),
                                 draws=args.draws)
                cell = (f"{100 * found['ours']:.1f}% ({100 * found['flagged']:.0f}%) "
                        f"{shown_width(found['width'], scale)}")
                if found['former'] is not None:
                    cell += (f" / {100 * found['former']:.1f}% "
                             f"{shown_width(found['former_width'], scale)}")
                cells.append(cell)
            print(f'| {name} | {noise} | ' + ' | '.join(cells) + ' |', flush=True)


def shown_width(value, scale):
    return 'open' if value is None else f'{scale * value:.3g}'


def boundary_rates(noise, runs, studies, rng):
    """{test: rejection rate} where each test's null hypothesis holds with equality."""
    margin, configs = 0.001, 5
    at_target = noisy(rng, 0.94, runs * configs * studies, noise).reshape(studies, configs, runs)
    p = stats.ttest_1samp(at_target, 0.94 - shift(noise), axis=2, alternative='greater').pvalue
    holm = np.array([inference.holm(list(row)) for row in p])
    rates = {'target test, one configuration at the target': np.mean(p[:, 0] < 0.05),
             'target claims of 5 configurations at the target, any "above", unadjusted':
             np.mean((p < 0.05).any(axis=1)),
             'the same, Holm-adjusted (as the report)': np.mean((holm < 0.05).any(axis=1))}
    for name, paired in (("TOST at the margin (0.1 points), Welch's", False),
                         ('TOST at the margin (0.1 points), paired', True)):
        rejected = 0
        for _ in range(studies):
            table = noisy(rng, [0.94, 0.94 + margin], runs, noise, CORRELATION if paired else 0)
            rejected += inference.equivalence_test(table[:, 0], table[:, 1], margin,
                                                   paired=paired)['equivalent'] is True
        rates[name] = rejected / studies
    rejected = 0
    for _ in range(studies):  # times: log-normal, 2% spread, the configuration 5% slower
        times = np.exp(rng.normal(0, 0.02, (runs, 2)) + [0, math.log(1.05)])
        rejected += inference.equivalence_test(times[:, 0], times[:, 1], 1.05,
                                               ratio=True)['equivalent'] is True
    rates['TOST at the time margin (1.05), log-normal times'] = rejected / studies
    return rates


def lack_of_fit_rates(noise, runs, studies, rng):
    rates = {}
    for name, curve in (('lack-of-fit test, law A (its size)', law_a()),
                        ('lack-of-fit test, exponential curve (its power)', exponential())):
        rejected = 0
        for _ in range(studies // 10):
            table = noisy(rng, 1 - curve.error_at(np.array(curve.grid)), runs, noise)
            test = fits.lack_of_fit(curve.grid, list(table.T), paired=True)
            rejected += test['p_value'] is not None and test['p_value'] < 0.05
        rates[name] = rejected / (studies // 10)
    return rates


def boundary_table(args, counts):
    studies = 10 * args.studies
    print(f'Rejection rates at the boundary of each null hypothesis (5% nominal), {studies} '
          'simulated studies per cell (the lack-of-fit rows: a tenth of that)\n')
    print('| test | runs | ' + ' | '.join(f'n = {n}' for n in counts) + ' |')
    print('|---|---|' + '---|' * len(counts))
    for noise in NOISES:
        rows = {}
        for n in counts:
            rng = np.random.default_rng(n)
            for name, rate in {**boundary_rates(noise, n, studies, rng),
                               **lack_of_fit_rates(noise, n, studies, rng)}.items():
                rows.setdefault(name, []).append(f'{100 * rate:.1f}%')
        for name, cells in rows.items():
            print(f'| {name} | {noise} | ' + ' | '.join(cells) + ' |', flush=True)


def simulated_halves(runs, temperature, rng, examples=10000, classes=10):
    """(halves, labels) of a simulated ensemble: each run predicts example i's class from its
    probabilities pi_i (Dirichlet, 0.15), independently of the other runs, so that the votes of a
    half are one multinomial draw per example (10,000 runs without 10,000 runs' predictions); the
    labels are drawn from pi^temperature, normalized (1: calibrated in the limit of many runs;
    0.6: labels less certain than the votes, an over-confident ensemble)."""
    probabilities = rng.dirichlet(np.full(classes, 0.15), examples)
    tempered = probabilities ** temperature
    tempered /= tempered.sum(axis=1, keepdims=True)
    labels = np.minimum((rng.random((examples, 1)) > tempered.cumsum(axis=1)).sum(axis=1),
                        classes - 1)
    halves = [(rng.multinomial((runs + 1 - h) // 2, probabilities), (runs + 1 - h) // 2)
              for h in (0, 1)]
    return halves, labels


def calibration_cell(runs, temperature, sets, seed):
    """The split-half estimate at `runs` runs: its mean over 3 * sets simulated test sets (the
    estimator's expectation, the truth its interval is for), and over `sets` others the coverage
    of that mean by the interval and the interval's mean width."""
    rng = np.random.default_rng(seed)
    estimates = [variance.split_half_calibration_error(
        *simulated_halves(runs, temperature, rng), rng=rng)[0]['estimate']
        for _ in range(3 * sets)]
    truth = float(np.mean(estimates))
    covered, widths = 0, []
    for _ in range(sets):
        entry = variance.split_half_calibration_error(*simulated_halves(runs, temperature, rng),
                                                      rng=rng)[0]
        covered += entry['ci_low'] <= truth <= entry['ci_high']
        widths.append(entry['ci_high'] - entry['ci_low'])
    return dict(mean=truth, standard_error=float(np.std(estimates, ddof=1)
                                                 / math.sqrt(len(estimates))),
                coverage=covered / sets, width=float(np.mean(widths)))


def calibration_table(args):
    """The calibration error of simulated ensembles (10,000 examples, 10 classes) at 100, 1000
    and 10,000 runs: one test set's figures, and the estimator's mean with its interval's
    coverage over --studies / 4 test sets."""
    sets = max(args.studies // 4, 10)
    print(f'Class-aggregated calibration error, 10,000 examples, 10 classes; the mean over '
          f'{3 * sets} simulated test sets, the coverage of that mean by the 95% interval and '
          f'its mean width over {sets} others\n')
    print('| ensemble | runs | one test set: estimate [95% CI] | plug-in | calibrated level '
          '(97.5%) | bins used | mean estimate (standard error) | coverage | mean width |')
    print('|---|---|---|---|---|---|---|---|---|')
    for name, temperature in (('calibrated in the limit (labels from pi)', 1.0),
                              ('over-confident (labels from pi^0.6)', 0.6)):
        for runs in (100, 1000, 10000):
            rng = np.random.default_rng(runs)
            halves, labels = simulated_halves(runs, temperature, rng)
            tally = variance.EnsembleTally(labels, 10)
            tally.votes[:] = [votes for votes, _ in halves]
            tally.accuracies = [0.0] * runs  # only their number counts here
            one = tally.calibration_error()
            cell = calibration_cell(runs, temperature, sets, seed=runs + 1)
            print(f"| {name} | {runs} | {one['estimate']:.4f} [{one['ci_low']:.4f}, "
                  f"{one['ci_high']:.4f}] | {one['plug_in']:.4f} | "
                  f"{one['calibrated_level']:.4f} ({one['calibrated_upper']:.4f}) | "
                  f"{'/'.join(map(str, one['bins_used']))} | {cell['mean']:.4f} "
                  f"({cell['standard_error']:.4f}) | {100 * cell['coverage']:.1f}% | "
                  f"{cell['width']:.4f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--studies', type=int, default=400)
    parser.add_argument('--runs', default='3,5,10,25')
    parser.add_argument('--draws', type=int, default=DRAWS)
    parser.add_argument('--rows', help='only the coverage rows whose name holds this text')
    parser.add_argument('--boundary', action='store_true')
    parser.add_argument('--calibration', action='store_true')
    args = parser.parse_args(argv)
    start = time.perf_counter()
    counts = [int(n) for n in args.runs.split(',')]
    if args.calibration:
        calibration_table(args)
    elif args.boundary:
        boundary_table(args, counts)
    else:
        coverage_table(args, counts)
    print(f'\n{time.perf_counter() - start:.0f} s')


if __name__ == '__main__':
    main()
