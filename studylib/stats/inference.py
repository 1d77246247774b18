"""Statistics on plain arrays of per-run numbers: a mean and its interval, the test of a mean
against a target (behind every record claim) with its one-sided bound, comparisons, equivalence
within a margin (TOST), Holm's adjustment, time ratios, and the runs needed to resolve a
difference fixed in advance.

Every function takes sequences of numbers (lists, numpy arrays, pandas columns) and returns a dict
that JSON holds: None where a number is undefined, with `reason` saying why. Intervals and tests
are scipy.stats' Student-t ones; they assume per-run values spread about normally, as these
trainings' accuracies do (coverage with and without a tail of bad runs: docs/studies.md;
tests/stats/test_inference.py holds it on normal runs).
"""
import contextlib
import math
import warnings

import numpy as np
from scipy import stats


def _sample(values, name):
    values = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(values).all():
        raise ValueError(f'{name} holds a value that is not finite (nan or inf): drop diverged '
                         'runs first, and count them')
    return values


def _finite(value):
    return float(value) if value is not None and math.isfinite(value) else None


@contextlib.contextmanager
def constant_samples_allowed():
    """scipy's t-tests without their warning about a sample whose values are all equal
    ("catastrophic cancellation"): its variance is 0, which the tests handle exactly. The
    functions here refuse the case where no sample has any spread themselves."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='Precision loss occurred',
                                category=RuntimeWarning)
        yield


def _check_confidence(confidence):
    if not 0 < confidence < 1:
        raise ValueError(f'confidence is a fraction in (0, 1), not {confidence}')


def describe(values, confidence=0.95):
    """n, mean, std (sample, ddof 1) and the Student-t interval of the mean (ci_low, ci_high):
    None where the sample is too small (n < 2) or has no spread."""
    _check_confidence(confidence)
    values = _sample(values, 'values')
    n = values.size
    entry = dict(n=n, mean=float(values.mean()) if n else None, std=None, ci_low=None,
                 ci_high=None)
    if n > 1:
        entry['std'] = float(values.std(ddof=1))
        if np.ptp(values) > 0:  # not std > 0: equal values can leave a std of 1e-17
            low, high = stats.t.interval(confidence, n - 1, loc=entry['mean'],
                                         scale=stats.sem(values))
            entry.update(ci_low=float(low), ci_high=float(high))
    return entry


def target_test(values, target, confidence=0.95, diverged=()):
    """The record claim "the mean accuracy of the runs exceeds target", counting every trained
    run: the one-sided t-test of "mean <= target" and the lower confidence bound that matches it
    (lower_bound > target exactly when p_value < 1 - confidence), so that they never disagree.

    values: the accuracies of the runs that did not diverge; diverged: those the diverged runs
    ended with (a record counts every run it trained; one with no finite accuracy enters at 0).
    The divergence rate comes with its exact Clopper-Pearson interval (scipy.stats.binomtest).

    Returns target, confidence, n (every run), diverged (their count), divergence_rate and
    divergence_ci ([low, high] at confidence), mean and std (every run), lower_bound, p_value
    (small when the mean exceeds the target), and reason where the test is undefined (n < 2, no
    spread)."""
    _check_confidence(confidence)
    kept = _sample(values, 'values')
    ended = np.nan_to_num(np.asarray(diverged, dtype=float).ravel(), nan=0.0, posinf=0.0,
                          neginf=0.0)
    every = np.concatenate([kept, ended])
    entry = dict(target=float(target), confidence=confidence, n=every.size, diverged=ended.size,
                 divergence_rate=None, divergence_ci=None,
                 mean=float(every.mean()) if every.size else None,
                 std=float(every.std(ddof=1)) if every.size > 1 else None, lower_bound=None,
                 p_value=None, reason=None)
    if every.size:
        rate = stats.binomtest(ended.size, every.size)
        entry.update(divergence_rate=ended.size / every.size, divergence_ci=[
            float(bound) for bound in rate.proportion_ci(confidence, method='exact')])
    if every.size < 2 or not np.ptp(every) > 0:
        entry['reason'] = ('fewer than 2 runs' if every.size < 2 else
                           'the runs have no spread: a t-test is undefined')
        return entry
    result = stats.ttest_1samp(every, target, alternative='greater')
    entry.update(p_value=float(result.pvalue),
                 lower_bound=float(result.confidence_interval(confidence).low))
    return entry


def compare(a, b, paired=False, confidence=0.95):
    """b against a: the difference of means (b's minus a's) with its interval and two-sided
    p-value, from the paired t-test (paired=True: a[i] and b[i] one pair, as runs of two
    configurations with the same seeds are) or Welch's.

    Returns difference, ci_low, ci_high, p_value, test (its name), effect_size (Cohen's d_av: the
    difference over the root mean of the two variances, so that a paired and an unpaired analysis
    of the same runs agree), n_a, n_b, correlation (Pearson's within pairs; paired only) and
    reason where undefined.
    """
    _check_confidence(confidence)
    a = _sample(a, 'a')
    b = _sample(b, 'b')
    if paired and a.size != b.size:
        raise ValueError(f'paired samples pair run i of a with run i of b: a has {a.size} runs, '
                         f'b {b.size}; give the runs both have, or paired=False')
    entry = dict(test='paired t-test' if paired else "Welch's t-test", n_a=a.size, n_b=b.size,
                 difference=float(b.mean() - a.mean()) if a.size and b.size else None,
                 ci_low=None, ci_high=None, p_value=None, effect_size=None, reason=None)
    if paired:
        entry['correlation'] = None
    if min(a.size, b.size) < 2:
        entry['reason'] = 'each side needs at least 2 runs'
        return entry
    spread = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    if not np.ptp(b - a if paired else np.concatenate([a - a.mean(), b - b.mean()])) > 0:
        entry['reason'] = 'no spread: a t-test is undefined'
        return entry
    entry['effect_size'] = entry['difference'] / spread if spread > 0 else None
    with constant_samples_allowed():
        result = stats.ttest_rel(b, a) if paired else stats.ttest_ind(b, a, equal_var=False)
    interval = result.confidence_interval(confidence)
    entry.update(ci_low=_finite(interval.low), ci_high=_finite(interval.high),
                 p_value=_finite(result.pvalue))
    if paired and np.ptp(a) > 0 and np.ptp(b) > 0:
        entry['correlation'] = float(stats.pearsonr(a, b).statistic)
    return entry


def holm(p_values):
    """Holm's step-down adjustment of a family of p-values (Holm 1979), controlling the chance of
    any false rejection in the family: the k-th smallest of m is multiplied by m - k + 1, and the
    adjusted values are made non-decreasing. An undefined test (None or NaN) is no member of the
    family: it is not counted in m and stays as it was (None or NaN)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if _defined(p))
    adjusted = list(p_values)
    running = 0.0
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def _defined(p):
    return p is not None and not math.isnan(p)


def equivalence_test(a, b, margin, paired=False, ratio=False, alpha=0.05):
    """Whether b is equivalent to a within a margin fixed in advance: the two one-sided tests
    (TOST; Schuirmann 1987) of "b - a <= -margin" and "b - a >= margin", each a t-test at level
    alpha (Welch's, or paired). Equivalence is shown when both reject: p_value, the larger of
    the two, is below alpha, exactly when the (1 - 2 alpha) interval of the difference (90% at
    alpha 0.05) lies inside (-margin, margin). Absence of a significant difference is no such
    evidence: only this test says "as fast as" or "as accurate as".

    ratio=True compares positive values (timed seconds) on log values: margin is a ratio above 1,
    the range [1 / margin, margin] of the ratio of geometric means b over a (1.05: within 5%
    either way). Otherwise margin is in the values' units (0.001 = 0.1 points of accuracy).

    Returns test, difference (b - a, or the ratio), margin, equivalence_range, ci_low and ci_high
    (the 1 - 2 alpha interval), confidence, p_value, p_lower and p_upper (the two one-sided
    tests), equivalent (None where undefined), n_a, n_b and reason.
    """
    if not 0 < alpha < 0.5:
        raise ValueError(f'alpha is a fraction in (0, 0.5), not {alpha}')
    a = _sample(a, 'a')
    b = _sample(b, 'b')
    if ratio:
        if not margin > 1:
            raise ValueError(f'a ratio margin is above 1 (1.05: within 5%), not {margin}')
        if (a <= 0).any() or (b <= 0).any():
            raise ValueError('ratio=True compares positive values (seconds)')
        a = np.log(a)
        b = np.log(b)
        shift = math.log(margin)
    else:
        if not margin > 0:
            raise ValueError(f'margin is a positive difference in the values\' units, not '
                             f'{margin}')
        shift = float(margin)
    if paired and a.size != b.size:
        raise ValueError(f'paired samples pair run i of a with run i of b: a has {a.size} runs, '
                         f'b {b.size}; give the runs both have, or paired=False')
    convert = math.exp if ratio else float
    entry = dict(test=('paired' if paired else "Welch's") + ' TOST' + (' on log values' if ratio
                                                                        else ''),
                 difference=convert(b.mean() - a.mean()) if a.size and b.size else None,
                 margin=float(margin), equivalence_range=[convert(-shift), convert(shift)],
                 ci_low=None, ci_high=None, confidence=1 - 2 * alpha, p_value=None,
                 p_lower=None, p_upper=None, equivalent=None, n_a=a.size, n_b=b.size,
                 reason=None)
    if min(a.size, b.size) < 2:
        entry['reason'] = 'each side needs at least 2 runs'
        return entry
    if not np.ptp(b - a if paired else np.concatenate([a - a.mean(), b - b.mean()])) > 0:
        entry['reason'] = 'no spread: a t-test is undefined'
        return entry
    with constant_samples_allowed():
        if paired:
            lower = stats.ttest_rel(b + shift, a, alternative='greater')
            upper = stats.ttest_rel(b - shift, a, alternative='less')
            interval = stats.ttest_rel(b, a).confidence_interval(1 - 2 * alpha)
        else:
            lower = stats.ttest_ind(b + shift, a, equal_var=False, alternative='greater')
            upper = stats.ttest_ind(b - shift, a, equal_var=False, alternative='less')
            interval = stats.ttest_ind(b, a, equal_var=False).confidence_interval(1 - 2 * alpha)
    p_value = max(float(lower.pvalue), float(upper.pvalue))
    entry.update(ci_low=convert(interval.low), ci_high=convert(interval.high),
                 p_lower=float(lower.pvalue), p_upper=float(upper.pvalue), p_value=p_value,
                 equivalent=p_value < alpha)
    return entry


def time_ratio(times_a, times_b, confidence=0.95):
    """How much longer b takes than a: the ratio of the geometric means of their timed seconds
    (b over a; 0.8 = 20% faster), with the interval of Welch's t on log seconds. Times of one
    device model only: ratios across models mean nothing."""
    _check_confidence(confidence)
    a = _sample(times_a, 'times_a')
    b = _sample(times_b, 'times_b')
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError('times are positive seconds')
    entry = dict(ratio=float(np.exp(np.log(b).mean() - np.log(a).mean())) if a.size and b.size
                 else None, ci_low=None, ci_high=None, n_a=a.size, n_b=b.size, reason=None)
    if min(a.size, b.size) < 2 or not (np.ptp(a) > 0 or np.ptp(b) > 0):
        entry['reason'] = 'each side needs at least 2 runs with some spread'
        return entry
    with constant_samples_allowed():
        interval = stats.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval(
            confidence)
    entry.update(ci_low=float(np.exp(interval.low)), ci_high=float(np.exp(interval.high)))
    return entry


def statistical_power(runs, std, difference, alpha=0.05, paired=False, correlation=0.0):
    """The chance that a two-sided t-test at level alpha rejects "no difference" with `runs` runs
    per configuration, when the true difference is `difference` and the runs' standard deviation
    `std` (the noncentral t distribution; pooled-variance t for two groups, the t-test of the
    differences for pairs whose values correlate by `correlation`)."""
    if paired:
        spread = std * math.sqrt(2 * (1 - correlation)) / math.sqrt(runs)
        freedom = runs - 1
    else:
        spread = std * math.sqrt(2 / runs)
        freedom = 2 * runs - 2
    critical = stats.t.ppf(1 - alpha / 2, freedom)
    shift = abs(difference) / spread
    # The lower tail P(T < -critical) as the upper tail of -shift: scipy's nct.cdf gives NaN there
    # for large shifts (e.g. 12 at 4 degrees of freedom) where nct.sf stays exact.
    power = stats.nct.sf(critical, freedom, shift) + stats.nct.sf(critical, freedom, -shift)
    if not math.isfinite(power):
        raise ValueError(f'the noncentral t gave no power for {runs} runs (shift {shift:g}, '
                         f'{freedom} degrees of freedom)')
    return float(power)


def runs_needed(std, difference, power=0.8, alpha=0.05, paired=False, correlation=0.0):
    """The fewest runs per configuration at which a two-sided t-test at level alpha detects a true
    difference `difference` with probability `power`, for runs whose standard deviation is `std`
    (same units as difference). paired: the runs pair up with this within-pair correlation.
    Examples: a difference of half a standard deviation at 80% power needs 64 runs per
    configuration (Cohen 1988, table 2.4.1); 0.08 points at a std of 0.15 points, 57."""
    if not std > 0 or not difference or not math.isfinite(difference):
        raise ValueError(f'give a positive std and a non-zero difference (got std {std}, '
                         f'difference {difference})')
    if not 0 < power < 1 or not 0 < alpha < 1 or not -1 < correlation < 1:
        raise ValueError('power and alpha are fractions in (0, 1), correlation in (-1, 1)')
    achieved = statistical_power
    low = 2
    high = 4
    while achieved(high, std, difference, alpha, paired, correlation) < power:
        low = high  # the doubling's last miss: the answer lies above it
        high *= 2
        if high > 1 << 40:
            raise ValueError('more runs than can be trained: the difference is too small')
    while low < high:  # the smallest n in [low, high] that reaches the power
        middle = (low + high) // 2
        if achieved(middle, std, difference, alpha, paired, correlation) >= power:
            high = middle
        else:
            low = middle + 1
    return low
