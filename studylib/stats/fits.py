"""Power-law fits of test error against training epochs, and what the paper derives from them:
epochs to a target accuracy and effective speedups, each with a confidence interval.

Units: accuracies and errors are fractions (0.94 and 0.06, not 94 and 6); epochs are epoch counts.
The law is the paper's (airbench paper, section "Alternating flip" experiments):

    error(epochs) = c + b * epochs**a,   a < 0 (error falls with training), b > 0, c >= 0.

c is the asymptote: an error at or below c is never reached. The fit is unweighted least squares,
so a change of units of the errors (percent: b and c times 100) leaves a and every epoch count
derived from the fit unchanged.

The intervals (epochs_to_accuracy_interval, effective_speedup_interval) propagate the cells'
sampling distribution through the fit by Monte Carlo: the cells (a curve's epoch counts, and the
compared configuration) draw their true means jointly, the fit is redone on every draw, and the
interval is the draws' central quantiles. Runs are normal about their cell's mean with one standard
deviation for every cell (airbench's run-to-run spread hardly changes with the epochs), so the
cells' variances are pooled:

- unpaired: sigma^2 is drawn as s_p^2 * f / chi^2_f (s_p^2 the pooled within-cell variance,
  f = sum (n_c - 1)) and each cell's mean as mean_c + sigma / sqrt(n_c) * Z_c: a multivariate
  Student t of f degrees of freedom (JCGM 101:2008, 6.4.9, for means known from repeated
  indications, the variance pooled as in its 6.4.9.4 note on a common standard deviation);
- paired (run i of every cell has the same seeds, as study.py gives it): the runs x cells table is
  a two-way layout, run effect plus residual (Montgomery, Design and Analysis of Experiments, the
  randomized complete block design). The cell means split into two independent parts: their grand
  mean, of variance MS_runs / (k n) on n - 1 degrees of freedom, and their contrasts, of
  covariance MS_residual / n on (n - 1)(k - 1). The means are drawn as mean_c + sqrt(f / chi^2_f)
  * (sqrt(MS_runs / (k n)) * Z_0 + sqrt(MS_residual / n) * (Z_c - mean of Z)), Z_0 shared by
  every cell, f Satterthwaite's (1946) degrees of freedom for the two mean squares weighted as
  they enter the variance of the statistic's linearization at the means. Each part drawn with its
  own chi-square would give a conservative fiducial interval, as Behrens-Fisher's is (measured:
  97.6% at n = 3). A speedup's shared run effect cancels, so it keeps about the residual's degrees
  of freedom; epochs to a target move with the grand mean and have fewer.

Each cell drawn alone from its own Student t of n - 1 degrees of freedom (the earlier interval)
covered 99% at n = 3 and was 1.45 to 1.85 times as wide as needed. Coverage and width measured by
simulation: docs/studies.md; tests/stats/test_fits.py holds them.

A curve of 4 or more epoch counts gets a lack-of-fit F test (lack_of_fit); a fit it rejects at 5%
marks every interval derived from it unreliable, as do a cell whose runs have no spread, fewer
than 3 runs in a cell, a fit stopped at a bound, a curve that does not fall measurably, and an
extrapolation.
"""
import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import least_squares

from .inference import constant_samples_allowed

MIN_EPOCH_COUNTS = 3  # the law has three parameters
STEEPEST_DECAY = -10.0  # lower bound on the exponent a
FLAT = 1e-6  # a law whose error falls by less than this fraction of the largest error, over the
#              epochs fitted, does not fall
DRAWS = 4000  # Monte Carlo draws of an interval
MIN_RUNS_RELIABLE = 3  # the fewest runs per cell at which the intervals' coverage was measured


@dataclass(frozen=True)
class PowerLaw:
    """error = c + b * epochs**a, with errors as fractions. at_bounds: the parameters the fit left
    at a bound of fit_power_law ('a', 'b', 'c'); empty when the law fits freely."""
    a: float
    b: float
    c: float
    at_bounds: tuple = ()

    def error_at(self, epochs):
        return self.c + self.b * np.asarray(epochs, dtype=float) ** self.a

    def epochs_for_error(self, error):
        """The law's inverse at `error`; math.inf where error <= c, which the law never reaches."""
        return float(_epochs_for_errors(self.a, self.b, self.c, error))


def fit_power_law(epochs, errors):
    """Least-squares fit of error = c + b * epochs**a to (epochs, error) points; a PowerLaw.

    Bounds: -10 <= a <= 0, b >= 0, 0 <= c <= max(errors). With exactly three distinct epoch counts
    the law interpolates them, unless the fit ends at a bound (at_bounds): errors that fall faster
    and faster with epochs, as in the first epochs of training, fit no law with c >= 0.

    Raises ValueError for fewer than 3 distinct epoch counts, non-positive epochs, non-finite
    values, errors all 0, errors that do not fall (the law falls by less than FLAT of the largest
    error over the epochs fitted) and a fit that does not converge.
    """
    x, y = _points(epochs, errors)
    return _fit(tuple(x), tuple(y))


@functools.lru_cache(maxsize=4096)
def _fit(x, y):
    """fit_power_law's least squares, remembered: a report fits the same baseline for every
    configuration and epoch count it compares with it."""
    x = np.array(x)
    y = np.array(y)
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
    fall = scale * (scaled.min() ** a - scaled.max() ** a)
    if a > -1e-9 or not fall > FLAT * y.max():
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


def fit_power_laws(epochs, errors):
    """fit_power_law on every row of errors (rows x epoch counts) at once, for the Monte Carlo
    intervals' thousands of fits: arrays a, b, c (nan where the errors do not fall) and `falls`.
    For a fixed exponent the bounded least squares over (b, c) has a closed form; the exponent is
    found on a grid over [-10, 0], refined by golden-section search (agreeing with fit_power_law
    to about 1e-8 in every derived epoch count: tested)."""
    x = np.asarray(epochs, dtype=float).ravel()
    y = np.atleast_2d(np.asarray(errors, dtype=float))
    log_scaled = np.log(x / math.exp(np.mean(np.log(x))))
    grid = np.concatenate([-np.geomspace(-STEEPEST_DECAY, 1e-4, 120), [0.0]])
    best = _least_squares(np.exp(grid[:, None] * log_scaled[None, :]), y)[0].argmin(axis=1)
    low = grid[np.maximum(best - 1, 0)]
    high = grid[np.minimum(best + 1, grid.size - 1)]
    a = _golden_section(lambda a: _least_squares(np.exp(a[:, None] * log_scaled), y,
                                                 per_row=True)[0], low, high)
    _, scale, c = _least_squares(np.exp(a[:, None] * log_scaled), y, per_row=True)
    fall = scale * (np.exp(a * log_scaled.min()) - np.exp(a * log_scaled.max()))
    falls = (a < -1e-9) & (fall > FLAT * y.max(axis=1))
    b = scale * np.exp(-a * np.mean(np.log(x)))
    return tuple(np.where(falls, value, np.nan) for value in (a, b, c)) + (falls,)


def _least_squares(power, y, per_row=False):
    """The least squares of c + b * power against y with b >= 0 and 0 <= c <= max(row of y):
    (sum of squared residuals, b, c). power: exponents x points, every row of y against every
    exponent (rows x exponents out), or, per_row, one exponent per row of y (rows out)."""
    n = y.shape[1]
    top = y.max(axis=1, keepdims=not per_row)
    sy = y.sum(1, keepdims=not per_row)
    syy = (y * y).sum(1, keepdims=not per_row)
    sp = power.sum(1)
    spp = (power * power).sum(1)
    spy = (power * y).sum(1) if per_row else y @ power.T
    with np.errstate(divide='ignore', invalid='ignore'):
        b = (n * spy - sp * sy) / (n * spp - sp * sp)
        c = (sy - b * sp) / n
    below = ~(c >= 0)  # c outside its bounds: at the bound, b refitted
    above = c > top
    b = np.where(below, spy / spp, np.where(above, (spy - top * sp) / spp, b))
    c = np.where(below, 0.0, np.where(above, top, c))
    flat = ~(b >= 0)  # no decrease: the best law is the constant
    b = np.where(flat, 0.0, b)
    c = np.where(flat, np.clip(sy / n, 0, top), c)
    if per_row:  # the residuals themselves: the golden section needs the sum's last digits
        residuals = c[:, None] + b[:, None] * power - y
        return (residuals * residuals).sum(1), b, c
    return syy - 2 * c * sy - 2 * b * spy + n * c * c + 2 * b * c * sp + b * b * spp, b, c


def _golden_section(function, low, high, iterations=40):
    """The minimum of a unimodal function on [low, high], elementwise (arrays of intervals)."""
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(iterations):
        left = high - ratio * (high - low)
        right = low + ratio * (high - low)
        keep_left = function(left) < function(right)
        low = np.where(keep_left, low, left)
        high = np.where(keep_left, right, high)
    return (low + high) / 2


def mean_accuracies(accuracies):
    """One mean accuracy per entry: each entry is a mean (a number) or one accuracy per run (a
    sequence, averaged here). Fractions: values above 1 (percentages) raise ValueError."""
    means = np.array([float(np.mean(entry)) for entry in accuracies])
    _check_fractions(means, 'accuracies')
    return means


def _check_fractions(values, name):
    values = np.asarray(values, dtype=float)
    if not np.isfinite(values).all():
        raise ValueError(f'{name} hold a value that is not finite (nan or inf): leave diverged '
                         'runs out, and count them')
    if (values < 0).any() or (values > 1).any():
        raise ValueError(f'{name} are fractions in [0, 1] (0.94, not 94): got '
                         f'{values.min():g} to {values.max():g}')


def epochs_to_accuracy(epochs_list, accuracies, target):
    """Epochs at which the power law fit to errors 1 - accuracy reaches accuracy `target`.

    epochs_list: one epoch count per entry of `accuracies` (at least 3 distinct); accuracies: per
    epoch count, the mean accuracy or the per-run accuracies (averaged); target: a fraction.
    math.inf where 1 - target <= c (the asymptote: never reached); the result may lie outside the
    measured epochs (an extrapolation). ValueError where no law fits (fit_power_law says why).
    """
    _check_fractions(target, 'target accuracies')
    law = fit_power_law(epochs_list, 1 - mean_accuracies(accuracies))
    return law.epochs_for_error(1 - float(target))


def effective_speedup(baseline_epochs, baseline_accuracies, epochs, accuracy):
    """The paper's effective speedup of a configuration over a baseline, a fraction (0.271 = 27.1%):
    the baseline's equivalent epochs for the configuration's error 1 - accuracy (its mean, given
    per-run accuracies), over epochs, minus 1. baseline_* as in epochs_to_accuracy. math.inf where
    that error is below the baseline's asymptote; negative where the configuration is worse.
    ValueError where the baseline's errors fit no law (a baseline that does not learn)."""
    equivalent = epochs_to_accuracy(baseline_epochs, baseline_accuracies,
                                    float(np.mean(accuracy)))
    return equivalent / epochs - 1


def _epochs_for_errors(a, b, c, error):
    """The laws' inverse at `error`, elementwise: inf where error <= c (never reached, or beyond
    the largest float), nan where a law is nan (its fit failed)."""
    a, b, c, error = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c, error)))
    with np.errstate(all='ignore'):
        epochs = np.exp(np.log((error - c) / b) / a)
    return np.where(np.isnan(a), np.nan, np.where(error > c, epochs, np.inf))


def epochs_to_accuracy_interval(runs_by_epochs, target, confidence=0.95, draws=DRAWS, seed=0,
                                paired=False):
    """epochs_to_accuracy with its confidence interval, from per-run accuracies.

    runs_by_epochs: {epoch count: per-run accuracies (fractions)}, 3 or more epoch counts.
    paired: run i of every epoch count has the same seeds (study.py's design; equally long cells).
    Returns a dict: estimate (epochs; None where undefined or never reached), ci_low, ci_high
    (None where open above: in more than (1 - confidence) / 2 of the draws the target lies beyond
    the asymptote), reliable (whether the coverage was measured in these conditions), reason (why
    not, or why undefined; None when reliable), extrapolated (the estimate outside the measured
    epochs), lack_of_fit, and the draws' accounting. Never raises for data that admit no answer.
    """
    epochs = sorted(runs_by_epochs)
    cells = [np.asarray(runs_by_epochs[e], dtype=float).ravel() for e in epochs]
    error = 1 - float(target)

    def statistic(means):
        a, b, c, _ = fit_power_laws(epochs, 1 - means)
        return _epochs_for_errors(a, b, c, error)

    result = _monte_carlo_interval(
        cells, statistic, lambda: epochs_to_accuracy(epochs, [cell.mean() for cell in cells],
                                                     target), confidence, draws, seed, paired)
    return _with_curve_checks(result, epochs, cells, result['estimate'],
                              'the target is reached', paired)


def effective_speedup_interval(baseline_runs_by_epochs, runs, epochs, confidence=0.95,
                               draws=DRAWS, seed=0, paired=False):
    """effective_speedup with its confidence interval, from per-run accuracies.

    baseline_runs_by_epochs: {epoch count: the baseline's per-run accuracies}, 3 or more; runs:
    the compared configuration's at `epochs`; paired: run i of every cell has the same seeds.
    Returns epochs_to_accuracy_interval's dict (estimate a fraction, 0.25 = 25% faster) and
    equivalent_epochs, the baseline's epochs for the compared error (which `extrapolated` judges).
    """
    baseline_epochs = sorted(baseline_runs_by_epochs)
    cells = [np.asarray(baseline_runs_by_epochs[e], dtype=float).ravel()
             for e in baseline_epochs] + [np.asarray(runs, dtype=float).ravel()]

    def statistic(means):
        a, b, c, _ = fit_power_laws(baseline_epochs, 1 - means[:, :-1])
        return _epochs_for_errors(a, b, c, 1 - means[:, -1]) / epochs - 1

    result = _monte_carlo_interval(
        cells, statistic, lambda: effective_speedup(
            baseline_epochs, [cell.mean() for cell in cells[:-1]], epochs, cells[-1].mean()),
        confidence, draws, seed, paired)
    equivalent = None if result['estimate'] is None else (1 + result['estimate']) * epochs
    result['equivalent_epochs'] = equivalent
    return _with_curve_checks(result, baseline_epochs, cells[:-1], equivalent,
                              "the compared configuration's error is reached by the baseline",
                              paired)


def pooled_variance(cells):
    """The cells' pooled within-cell variance and its degrees of freedom, sum_c (n_c - 1)."""
    freedom = sum(cell.size - 1 for cell in cells)
    squares = sum(((cell - cell.mean()) ** 2).sum() for cell in cells)
    return (squares / freedom if freedom else math.nan), freedom


def variance_components(table):
    """The two-way layout of a runs x cells table (run i of every cell shares its seeds), run
    effect plus residual: (residual mean square, its degrees of freedom (n - 1)(k - 1), the runs'
    mean square k * var(run means), its degrees of freedom n - 1). Expectations: sigma_e^2 and
    sigma_e^2 + k * sigma_u^2 (Montgomery, the randomized complete block design)."""
    runs, cells = table.shape
    residual = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0) + table.mean()
    residual_freedom = (runs - 1) * (cells - 1)
    return ((residual ** 2).sum() / residual_freedom, residual_freedom,
            cells * table.mean(axis=1).var(ddof=1), runs - 1)


def _mean_draws(cells, paired, draws, rng, statistic):
    """Draws of the cells' true means given their runs, draws x cells (the module's docstring)."""
    means = np.array([cell.mean() for cell in cells])
    if paired:
        table = np.column_stack(cells)
        runs, count = table.shape
        residual, residual_freedom, between, between_freedom = variance_components(table)
        parts = (between / (count * runs), residual / runs)
        freedom = _satterthwaite(statistic, means, parts, (between_freedom, residual_freedom))
        scale = np.sqrt(freedom / rng.chisquare(freedom, draws))[:, None]
        normal = rng.standard_normal((draws, count))
        return means + scale * (math.sqrt(parts[0]) * rng.standard_normal((draws, 1))
                                + math.sqrt(parts[1]) * (normal - normal.mean(axis=1,
                                                                               keepdims=True)))
    pooled, freedom = pooled_variance(cells)
    sigma2 = pooled * freedom / rng.chisquare(freedom, draws)
    sizes = np.array([cell.size for cell in cells])
    return means + np.sqrt(sigma2[:, None] / sizes) * rng.standard_normal((draws, means.size))


def _satterthwaite(statistic, means, parts, freedoms, step=1e-5):
    """The degrees of freedom of the statistic's linearization at the means, whose variance is
    (sum w)^2 * parts[0] + (sum w^2 - (sum w)^2 / k) * parts[1] for its gradient w (central
    differences) and the grand mean's and contrasts' variances: Satterthwaite (1946). The fewer
    of the two where the gradient is not finite (a target beyond reach, a fit that fails)."""
    count = means.size
    shifted = means + step * np.concatenate([np.eye(count), -np.eye(count)])
    values = statistic(shifted)
    with np.errstate(invalid='ignore'):  # inf - inf where a shifted target is beyond reach
        gradient = (values[:count] - values[count:]) / (2 * step)
    if not np.isfinite(gradient).all():
        return float(min(freedoms))
    total = gradient.sum()
    terms = np.array([total ** 2 * parts[0],
                      ((gradient ** 2).sum() - total ** 2 / count) * parts[1]])
    if not terms.sum() > 0:
        return float(min(freedoms))
    return float(terms.sum() ** 2 / (terms ** 2 / np.array(freedoms)).sum())


def _monte_carlo_interval(cells, statistic, point_estimate, confidence, draws, seed, paired):
    """The interval of a statistic of cell means, their true means drawn jointly (_mean_draws): a
    dict of the estimate, the interval and the reasons it is not reliable."""
    if not 0 < confidence < 1:
        raise ValueError(f'confidence is a fraction in (0, 1), not {confidence}')
    for cell in cells:
        if cell.size == 0:
            raise ValueError('every epoch count (and the compared configuration) needs runs')
        _check_fractions(cell, 'accuracies')
    if paired and len({cell.size for cell in cells}) > 1:
        raise ValueError('paired cells hold run i of each at position i: give every cell the '
                         f'same runs (sizes {sorted({cell.size for cell in cells})}), or '
                         'paired=False')
    result = dict(estimate=None, ci_low=None, ci_high=None, reliable=False, reason=None,
                  confidence=confidence, method='Monte Carlo, pooled variance'
                  + (', runs paired by seed' if paired else ''), paired=paired,
                  draws=draws, failed_draws=None, unreachable_draws=None,
                  fewest_runs=int(min(cell.size for cell in cells)), extrapolated=None)
    reasons = []
    try:
        estimate = point_estimate()
    except ValueError as error:
        result['reason'] = f'undefined: {error}'
        return result
    if math.isinf(estimate):
        reasons.append('never reached: the target lies beyond the fitted asymptote')
    else:
        result['estimate'] = float(estimate)
    if result['fewest_runs'] < 2:
        result['reason'] = '; '.join([*reasons, 'no interval: a cell has a single run, '
                                      'so its spread is unknown'])
        return result
    if result['fewest_runs'] < MIN_RUNS_RELIABLE:
        reasons.append(f"{result['fewest_runs']} runs in a cell: coverage was measured from "
                       f'{MIN_RUNS_RELIABLE} runs per cell')
    flat = sum(not np.ptp(cell) > 0 for cell in cells)
    if flat:
        reasons.append(f'{flat} of {len(cells)} cells have runs without spread (all equal): '
                       'a spread of 0 is not what normal runs give, and the interval rests on the '
                       'other cells alone' if flat < len(cells) else
                       'no cell has any spread: the interval has no width to give')
    values = statistic(_mean_draws(cells, paired, draws, np.random.default_rng(seed), statistic))
    failed = int(np.isnan(values).sum())
    unreachable = int(np.isposinf(values).sum())
    result.update(failed_draws=failed, unreachable_draws=unreachable)
    tail = (1 - confidence) / 2
    if failed > tail * draws:
        reasons.append(f'in {failed / draws:.0%} of the draws the errors fit no falling law')
    kept = np.sort(values[~np.isnan(values)])
    if kept.size:
        low = kept[min(int(math.floor(tail * kept.size)), kept.size - 1)]
        high = kept[min(int(math.ceil((1 - tail) * kept.size)) - 1, kept.size - 1)]
        result['ci_low'] = float(low) if math.isfinite(low) else None
        result['ci_high'] = float(high) if math.isfinite(high) else None  # open: [low, inf)
    result.update(reliable=not reasons, reason='; '.join(reasons) or None)
    return result


def lack_of_fit(epochs, cells, paired=False):
    """The lack-of-fit F test of the power law on a curve of 4 or more epoch counts (Draper and
    Smith, Applied Regression Analysis, 2.1, "lack of fit and pure error"): the means' misfit,
    sum n_c (mean_c - fit_c)^2 on k - 3 degrees of freedom, against the runs' spread: the pooled
    within-cell variance or, paired, the residual mean square (a run effect shifts every cell
    alike, as the law's c does). A dict: statistic, p_value, freedom ([k - 3, the spread's]),
    reason (None, or why there is no test)."""
    entry = dict(statistic=None, p_value=None, freedom=None, reason=None)
    if len(cells) <= MIN_EPOCH_COUNTS:
        entry['reason'] = f'{len(cells)} epoch counts: the law\'s 3 parameters leave none to test'
        return entry
    means = np.array([cell.mean() for cell in cells])
    sizes = np.array([cell.size for cell in cells])
    try:
        law = fit_power_law(epochs, 1 - means)
    except ValueError as error:
        entry['reason'] = f'no law fits: {error}'
        return entry
    misfit = (sizes * (1 - means - law.error_at(epochs)) ** 2).sum() / (len(cells) - 3)
    if paired:
        spread, freedom = variance_components(np.column_stack(cells))[:2]
    else:
        spread, freedom = pooled_variance(cells)
    if not freedom or not spread > 0:
        entry['reason'] = 'the runs have no spread to measure the misfit against'
        return entry
    statistic = misfit / spread
    entry.update(statistic=float(statistic), freedom=[len(cells) - 3, int(freedom)],
                 p_value=float(stats.f.sf(statistic, len(cells) - 3, freedom)))
    return entry


def _with_curve_checks(result, epochs, cells, epochs_found, what, paired):
    """Add to a result the conditions under which its coverage was not measured: a curve whose
    last epoch count is not measurably more accurate than its first (one-sided Welch t-test at
    5%), a power law the means reject (lack_of_fit at 5%), a fit stopped at a bound, an answer
    outside the measured epochs."""
    reasons = [result['reason']] if result['reason'] else []
    if result['estimate'] is None and not result['reliable'] and result['ci_low'] is None:
        return result
    first = cells[0]
    last = cells[-1]
    if first.size > 1 and last.size > 1:
        if np.ptp(first) > 0 or np.ptp(last) > 0:
            with constant_samples_allowed():
                p_value = stats.ttest_ind(last, first, equal_var=False,
                                          alternative='greater').pvalue
        else:  # runs without spread (scipy would warn and give nan): the means decide
            p_value = 0.0 if last[0] > first[0] else 1.0
        if not p_value < 0.05:
            reasons.append(f'the curve does not fall measurably: accuracy at {epochs[-1]:g} '
                           f'epochs is not above that at {epochs[0]:g} (Welch p = '
                           f'{p_value:.2g})')
    result['lack_of_fit'] = lack_of_fit(epochs, cells, paired)
    if result['lack_of_fit']['p_value'] is not None and result['lack_of_fit']['p_value'] < 0.05:
        fit = result['lack_of_fit']
        reasons.append(f"the power law does not fit the means (lack-of-fit F = "
                       f"{fit['statistic']:.3g} on {fit['freedom'][0]} and {fit['freedom'][1]} "
                       f"degrees of freedom, p = {fit['p_value']:.2g})")
    law = fit_power_law(epochs, [1 - cell.mean() for cell in cells])
    if law.at_bounds:
        miss = np.abs(law.error_at(epochs) - np.array([1 - cell.mean() for cell in cells])).max()
        reasons.append(f"the fit stopped at the bound of {', '.join(law.at_bounds)} and misses "
                       f'the means by up to {100 * miss:.2f} points')
    if epochs_found is not None:
        result['extrapolated'] = not epochs[0] <= epochs_found <= epochs[-1]
        if result['extrapolated']:
            reasons.append(f'an extrapolation: {what} at {epochs_found:.3g} epochs, outside the '
                           f'measured {epochs[0]:g} to {epochs[-1]:g}')
    result.update(reliable=not reasons, reason='; '.join(reasons) or None)
    return result
