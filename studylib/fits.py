"""Power-law fits of test error against training epochs, and the quantities the paper derives from
them: epochs to a target accuracy, effective speedups, and their bootstrap intervals over runs.

Units: accuracies and errors are fractions (0.94 and 0.06, not 94 and 6); epochs are epoch counts.
The law is the paper's (airbench paper, section "Alternating flip" experiments):

    error(epochs) = c + b * epochs**a,   a < 0 (error falls with training), b > 0, c >= 0.

c is the asymptote: an error at or below c is never reached. The least-squares fit is unweighted,
so it is equivariant under a change of units of the errors (percent instead of fractions multiplies
b and c by 100 and leaves a and every epoch count derived from the fit unchanged).
"""
import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

MIN_EPOCH_COUNTS = 3  # the law has three parameters
STEEPEST_DECAY = -10.0  # lower bound on the exponent a


@dataclass(frozen=True)
class PowerLaw:
    """error = c + b * epochs**a, with errors as fractions. at_bounds: the parameters the fit left
    at a bound of fit_power_law ('a', 'b', 'c'); empty when the law fits freely."""
    a: float
    b: float
    c: float
    at_bounds: tuple = ()

    def error_at(self, epochs):
        """The law's error after `epochs` epochs (a number or an array of them)."""
        return self.c + self.b * np.asarray(epochs, dtype=float) ** self.a

    def epochs_for_error(self, error):
        """The inverse, epochs = ((error - c) / b) ** (1 / a); math.inf where error <= c, which
        the law never reaches."""
        if error <= self.c:
            return math.inf
        return float(((error - self.c) / self.b) ** (1 / self.a))


def fit_power_law(epochs, errors):
    """Least-squares fit of error = c + b * epochs**a to (epochs, error) points; a PowerLaw.

    Bounds: -10 <= a <= 0, b >= 0, 0 <= c <= max(errors). Start: c at 0.9 * min(errors), a and b
    from a straight line through log(error - c) against log(epochs). The fit runs on
    epochs / (their geometric mean) for conditioning; b is converted back. With exactly three
    distinct epoch counts the law interpolates them, unless the fit ends at a bound (its
    at_bounds): errors that fall faster and faster with epochs, as in the first epochs of
    training, fit no law with c >= 0, and the best one at c = 0 misses the points.

    Raises ValueError for fewer than 3 distinct epoch counts, non-positive epochs, non-finite
    values, errors all 0, errors that do not fall with epochs (the fit ends at a = 0 or b = 0) and
    a fit that does not converge.
    """
    x, y = _points(epochs, errors)
    return _fit(tuple(x), tuple(y))


@functools.lru_cache(maxsize=65536)
def _fit(x, y):
    """fit_power_law's least squares, remembered: a bootstrap refits the same resampled baseline
    for every configuration and epoch count it compares with it."""
    x, y = np.array(x), np.array(y)
    reference = math.exp(np.mean(np.log(x)))
    scaled = x / reference

    def residuals(params):
        a, scale, c = params
        return c + scale * scaled ** a - y

    def jacobian(params):
        a, scale, _ = params
        power = scaled ** a
        return np.column_stack([scale * power * np.log(scaled), power, np.ones_like(x)])

    result = least_squares(residuals, _initial_guess(scaled, y), jac=jacobian,
                           bounds=([STEEPEST_DECAY, 0.0, 0.0], [0.0, np.inf, y.max()]),
                           method='trf', x_scale='jac', ftol=1e-14, xtol=1e-14, gtol=1e-14,
                           max_nfev=2000)
    a, scale, c = result.x
    if result.status <= 0:
        raise ValueError(f'the power-law fit did not converge: {result.message}')
    if a > -1e-9 or scale <= 1e-12 * max(y.max(), 1e-300):
        raise ValueError('the errors do not fall with epochs: no decreasing power law '
                         f'c + b * epochs**a fits them (fit ended at a={a:.3g}, b={scale:.3g})')
    at_bounds = tuple(name for name, active in zip('abc', result.active_mask) if active)
    return PowerLaw(a=float(a), b=float(scale * reference ** -a), c=float(c), at_bounds=at_bounds)


def _points(epochs, errors):
    x = np.asarray(epochs, dtype=float).ravel()
    y = np.asarray(errors, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f'{x.size} epoch counts but {y.size} errors')
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError('epochs and errors must be finite')
    if (x <= 0).any():
        raise ValueError('epoch counts must be positive')
    if y.max() <= 0:
        raise ValueError('every error is 0: there is no decrease to fit')
    distinct = np.unique(x)
    if distinct.size < MIN_EPOCH_COUNTS:
        raise ValueError(f'a power law c + b * epochs**a has 3 parameters: it needs at least '
                         f'{MIN_EPOCH_COUNTS} distinct epoch counts, got {distinct.size} '
                         f'({", ".join(f"{e:g}" for e in distinct)})')
    return x, y


def _initial_guess(scaled, y):
    """(a, b at the reference epoch count, c): c below the smallest error, a and b from a line
    through log(error - c) against log(epochs)."""
    c = 0.9 * max(y.min(), 0.0)
    excess = np.maximum(y - c, 1e-12 * max(y.max(), 1e-300))
    slope, intercept = np.polyfit(np.log(scaled), np.log(excess), 1)
    return [float(np.clip(slope, STEEPEST_DECAY + 1e-3, -1e-3)), float(np.exp(intercept)), c]


def mean_accuracies(accuracies):
    """One mean accuracy per entry: each entry is a mean (a number) or one accuracy per run (a
    sequence, averaged here). Fractions: values above 1 (percentages) raise ValueError."""
    means = np.array([float(np.mean(entry)) for entry in accuracies])
    _check_fractions(means, 'accuracies')
    return means


def _check_fractions(values, name):
    values = np.asarray(values, dtype=float)
    if not np.isfinite(values).all() or (values < 0).any() or (values > 1).any():
        raise ValueError(f'{name} are fractions in [0, 1] (0.94, not 94): got '
                         f'{values.min():g} to {values.max():g}')


def epochs_to_accuracy(epochs_list, accuracies, target):
    """Epochs at which the power law fit to errors 1 - accuracy reaches accuracy `target`.

    epochs_list: one epoch count per entry of `accuracies` (at least 3 distinct). accuracies: per
    epoch count, the mean accuracy or the per-run accuracies (averaged). target: a fraction.
    Returns ((1 - target - c) / b) ** (1 / a), or math.inf when 1 - target <= c (the fitted
    asymptote: the target is never reached). The result may lie outside the measured epochs
    (an extrapolation).
    """
    _check_fractions(target, 'target accuracies')
    law = fit_power_law(epochs_list, 1 - mean_accuracies(accuracies))
    return law.epochs_for_error(1 - float(target))


def effective_speedup(baseline_epochs, baseline_accuracies, epochs, accuracy):
    """The paper's effective speedup of a configuration over a baseline, a fraction (0.271 = 27.1%).

    Fit the baseline's power law (baseline_epochs, baseline_accuracies as in epochs_to_accuracy),
    invert it at the configuration's error 1 - accuracy (its mean if per-run accuracies are given)
    to get the baseline's equivalent epochs, and return equivalent_epochs / epochs - 1. math.inf
    when the configuration's error is below the baseline's asymptote; negative when the
    configuration is worse than the baseline.
    """
    equivalent = epochs_to_accuracy(baseline_epochs, baseline_accuracies,
                                    float(np.mean(accuracy)))
    return equivalent / epochs - 1


@dataclass(frozen=True)
class BootstrapInterval:
    """A percentile bootstrap interval and the accounting of the resamples behind it.

    failed: resamples whose statistic raised ValueError (the fit was impossible); they are left out
    of the percentiles. unreachable: resamples whose statistic was +inf (a target beyond the
    fitted asymptote); they are kept, so that high is math.inf (an open interval) once more than
    (1 - confidence) / 2 of the resamples are unreachable.
    """
    estimate: float
    low: float
    high: float
    confidence: float
    resamples: int
    failed: int
    unreachable: int

    @property
    def failed_fraction(self):
        return self.failed / self.resamples

    @property
    def unreachable_fraction(self):
        return self.unreachable / self.resamples


def bootstrap_interval(runs_by_cell, statistic, resamples=2000, confidence=0.95, seed=0):
    """Percentile bootstrap interval of a statistic of cell means, resampling runs within cells.

    runs_by_cell: {cell: per-run values (accuracies as fractions)}, a cell being e.g. one
    (configuration, epoch count). statistic: maps {cell: mean} to a number (may be math.inf; may
    raise ValueError when its fit is impossible). Each resample draws, independently per cell,
    as many runs as the cell has, with replacement (numpy Generator seeded with `seed`), and
    recomputes every mean and the statistic. The interval is the lower (1 - confidence) / 2 and
    upper (1 + confidence) / 2 order statistics of the resampled values (numpy's 'lower' and
    'higher' quantiles: no interpolation, so +inf is kept rather than turned into nan).

    scipy.stats.bootstrap resamples several samples independently too, but its BCa default needs a
    jackknife over every run (one more power-law fit per run), and its intervals come back nan
    when a resample fails; failed and infinite resamples must be counted and reported instead.
    A RuntimeWarning names the failed resamples; ValueError if all fail or a cell is empty.
    """
    cells = {cell: np.asarray(values, dtype=float).ravel() for cell, values in runs_by_cell.items()}
    empty = [cell for cell, values in cells.items() if values.size == 0]
    if empty:
        raise ValueError(f'cells without runs: {empty}')
    estimate = float(statistic({cell: values.mean() for cell, values in cells.items()}))
    rng = np.random.default_rng(seed)
    resampled_means = {cell: values[rng.integers(0, values.size, (resamples, values.size))]
                       .mean(axis=1) for cell, values in cells.items()}
    values, failed = [], 0
    for index in range(resamples):
        try:
            values.append(float(statistic({cell: means[index]
                                           for cell, means in resampled_means.items()})))
        except ValueError:
            failed += 1
    if not values:
        raise ValueError(f'all {resamples} bootstrap resamples failed')
    if failed:
        warnings.warn(f'{failed} of {resamples} bootstrap resamples could not be fit; they are '
                      'left out of the interval', RuntimeWarning, stacklevel=2)
    values = np.array(values)
    tail = (1 - confidence) / 2
    return BootstrapInterval(estimate=estimate,
                             low=float(np.quantile(values, tail, method='lower')),
                             high=float(np.quantile(values, 1 - tail, method='higher')),
                             confidence=confidence, resamples=resamples, failed=failed,
                             unreachable=int(np.isposinf(values).sum()))


def bootstrap_epochs_to_accuracy(runs_by_epochs, target, **options):
    """Bootstrap interval of epochs_to_accuracy. runs_by_epochs: {epoch count: per-run
    accuracies}; options: those of bootstrap_interval."""
    epochs = sorted(runs_by_epochs)
    return bootstrap_interval(
        runs_by_epochs,
        lambda means: epochs_to_accuracy(epochs, [means[e] for e in epochs], target), **options)


def bootstrap_effective_speedup(baseline_runs_by_epochs, runs, epochs, **options):
    """Bootstrap interval of effective_speedup: the baseline's runs per epoch count
    ({epoch count: per-run accuracies}) and the compared configuration's runs at `epochs` are
    resampled independently. options: those of bootstrap_interval."""
    baseline_epochs = sorted(baseline_runs_by_epochs)
    cells = {('baseline', e): baseline_runs_by_epochs[e] for e in baseline_epochs}
    cells[('compared', epochs)] = runs

    def speedup(means):
        return effective_speedup(baseline_epochs, [means[('baseline', e)] for e in baseline_epochs],
                                 epochs, means[('compared', epochs)])
    return bootstrap_interval(cells, speedup, **options)
