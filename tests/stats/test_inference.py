"""studylib.stats.inference against R, scipy and Cohen's table: comparisons, target claims, TOST,
runs_needed, Holm, time ratios; simulated, TOST's size and the intervals' coverage (slow)."""
import math

import numpy as np
import pytest
from scipy import stats

import simulated
import study

# Student's sleep data (Student 1908; R's `sleep`): extra hours of sleep under two drugs, the same
# 10 patients. The table below is R 4.x's t.test(extra ~ group, data = sleep, paired = TRUE, or
# not: Welch), which gives group 1 minus group 2 (here negated: SLEEP_2 minus SLEEP_1).
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


@pytest.mark.parametrize('paired, test, interval, p_value, digits, correlation', [
    (True, 'paired t-test', (0.7001142, 2.4598858), 0.002833, 5e-7,
     np.corrcoef(SLEEP_1, SLEEP_2)[0, 1]),
    (False, "Welch's t-test", (-0.2054832, 3.3654832), 0.07939, 5e-6, None)])
def test_comparison_is_rs_on_students_sleep_data(paired, test, interval, p_value, digits,
                                                 correlation):
    result = study.compare(SLEEP_1, SLEEP_2, paired=paired)
    assert result['test'] == test and result['difference'] == pytest.approx(1.58)
    assert (result['ci_low'], result['ci_high']) == pytest.approx(interval, abs=1e-7)
    assert result['p_value'] == pytest.approx(p_value, abs=digits)
    assert result.get('correlation') == pytest.approx(correlation)


def test_comparison_agrees_with_scipy_and_its_effect_size_is_d_av():
    rng = np.random.default_rng(0)
    a = 0.94 + rng.normal(0, 0.0015, 12)
    b = 0.941 + rng.normal(0, 0.002, 9)
    welch = stats.ttest_ind(b, a, equal_var=False)
    result = study.compare(a, b, confidence=0.9)
    interval = welch.confidence_interval(0.9)
    assert (result['ci_low'], result['ci_high'], result['p_value']) == pytest.approx(
        (interval.low, interval.high, welch.pvalue), rel=1e-12)
    d_av = (b.mean() - a.mean()) / math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    assert result['effect_size'] == pytest.approx(d_av, rel=1e-12)
    assert study.compare(a[:9], b, paired=True)['effect_size'] == pytest.approx(
        (b.mean() - a[:9].mean()) / math.sqrt((a[:9].var(ddof=1) + b.var(ddof=1)) / 2))


@pytest.mark.parametrize('test, undefined', [
    (study.compare, 'p_value'),
    (lambda a, b, **kwargs: study.equivalence_test(a, b, 0.01, **kwargs), 'equivalent')],
    ids=['comparison', 'equivalence'])
def test_says_why_where_undefined_and_refuses_bad_pairs(test, undefined):
    assert test([0.9], [0.91, 0.92])['reason'] == 'each side needs at least 2 runs'
    flat = test([0.9, 0.9], [0.9, 0.9])
    assert flat[undefined] is None and 'no spread' in flat['reason']
    with pytest.raises(ValueError, match='paired samples'):
        test([0.9, 0.91, 0.92], [0.9, 0.91], paired=True)
    with pytest.raises(ValueError, match='not finite'):
        test([0.9, float('nan')], [0.9, 0.91])


# Record claims: nine runs about 94.05% and one that diverged at 10%; ten runs about 94.08%
NINE = [0.93947, 0.93986, 0.94011, 0.94037, 0.9405, 0.94063, 0.94082, 0.94121, 0.94153]
TEN = [0.93876, 0.93943, 0.93983, 0.94037, 0.94077, 0.9409, 0.94117, 0.94157, 0.94224, 0.94265]


def test_target_claim_counts_the_diverged_runs():
    """p = 0.024 without the diverged run; a record counts every run it trained: with it, p =
    0.827. The rate 1 of 10 has its Clopper-Pearson interval: B(0.025; 1, 10), B(0.975; 2, 9)."""
    assert study.target_test(NINE, 0.94)['p_value'] == pytest.approx(0.024189, abs=1e-6)
    result = study.target_test(NINE, 0.94, diverged=[0.10])
    assert result['p_value'] == pytest.approx(
        stats.ttest_1samp(NINE + [0.10], 0.94, alternative='greater').pvalue, rel=1e-12)
    assert result['p_value'] == pytest.approx(0.826914, abs=1e-6)
    assert (result['n'], result['diverged'], result['divergence_rate']) == (10, 1, 0.1)
    assert result['divergence_ci'] == pytest.approx(
        [stats.beta.ppf(0.025, 1, 10), stats.beta.ppf(0.975, 2, 9)], rel=1e-9)
    assert result['mean'] == pytest.approx(np.mean(NINE + [0.10]))
    not_finite = study.target_test(NINE, 0.94, diverged=[float('nan')])  # no answer: 0 correct
    assert not_finite['mean'] == pytest.approx(np.mean(NINE + [0.0]))


def test_target_claim_is_scipys_one_sided_t_test_and_its_bound_never_disagrees():
    """Ten runs whose two-sided 95% interval [0.93990, 0.94164] holds 0.94, one-sided p 0.0387: the
    bound given is the one-sided one, above 0.94 as the claim is, here and in 400 samples."""
    result = study.target_test(TEN, 0.94)
    scipy_test = stats.ttest_1samp(TEN, 0.94, alternative='greater')
    assert result['p_value'] == pytest.approx(scipy_test.pvalue, rel=1e-12)
    assert result['p_value'] == pytest.approx(0.038675, abs=1e-6)
    assert result['lower_bound'] == pytest.approx(scipy_test.confidence_interval(0.95).low,
                                                  rel=1e-12)
    assert result['lower_bound'] == pytest.approx(0.9400619, abs=1e-7)
    assert 'ci_low' not in result
    assert study.target_test([0.94], 0.94)['reason'] == 'fewer than 2 runs'
    rng = np.random.default_rng(4)
    for _ in range(400):
        result = study.target_test(0.9405 + rng.normal(0, 0.0015, 8), 0.94)
        assert (result['lower_bound'] > 0.94) == (result['p_value'] < 0.05)


def test_five_target_claims_need_holms_adjustment():
    """Five configurations truly at the target, 10 runs each, 20,000 simulated studies (standard
    error 0.3 points): one at least reads "above" 1 - 0.95^5 = 22.6% of the time; with Holm's
    adjustment over the five, at most 5%."""
    rng = np.random.default_rng(5)
    values = 0.94 + rng.normal(0, 0.0015, (20000, 5, 10))
    p = stats.ttest_1samp(values, 0.94, axis=2, alternative='greater').pvalue
    assert np.mean((p < 0.05).any(axis=1)) == pytest.approx(1 - 0.95 ** 5, abs=0.01)
    adjusted = np.array([study.holm(list(row)) for row in p])
    assert np.mean((adjusted < 0.05).any(axis=1)) <= 0.05 + 0.005


def by_hand(a, b, paired):
    """The difference b - a, its standard error and degrees of freedom: paired, or Welch's."""
    if paired:
        differences = np.subtract(b, a)
        return differences.mean(), differences.std(ddof=1) / math.sqrt(len(a)), len(a) - 1
    va = np.var(a, ddof=1) / len(a)
    vb = np.var(b, ddof=1) / len(b)
    freedom = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return np.mean(b) - np.mean(a), math.sqrt(va + vb), freedom


A = [0.9410, 0.9395, 0.9402, 0.9421, 0.9388, 0.9407]
B = [0.9415, 0.9401, 0.9398, 0.9409, 0.9412]


@pytest.mark.parametrize('a, b, margin, paired, test, equivalent', [
    (A, B, 0.002, False, "Welch's TOST", True), (A, B, 0.0005, False, "Welch's TOST", False),
    (SLEEP_1, SLEEP_2, 2.0, True, 'paired TOST', False)])  # sleep: mean difference 1.58 hours
def test_equivalence_is_two_one_sided_t_tests(a, b, margin, paired, test, equivalent):
    """Each one-sided p by hand at the shifted means, p the larger one; the 90% interval:
    difference +- t(0.95) * se; equivalence exactly when it lies inside the margin."""
    result = study.equivalence_test(a, b, margin, paired=paired)
    difference, se, freedom = by_hand(a, b, paired)
    assert (result['p_lower'], result['p_upper']) == pytest.approx(
        (stats.t.sf((difference + margin) / se, freedom),
         stats.t.cdf((difference - margin) / se, freedom)), rel=1e-10)
    assert result['p_value'] == max(result['p_lower'], result['p_upper'])
    half = stats.t.ppf(0.95, freedom) * se
    assert (result['ci_low'], result['ci_high']) == pytest.approx((difference - half,
                                                                   difference + half))
    assert (result['test'], result['equivalent'], result['confidence']) == (test, equivalent, 0.9)
    assert (-margin < result['ci_low'] and result['ci_high'] < margin) == equivalent


def test_times_are_compared_on_log_seconds():
    """Their ratio is that of geometric means, its interval Welch's on log seconds; ratio=True
    makes the same equivalence tests on log seconds, within [1/1.05, 1.05]."""
    a = [2.039, 2.039, 2.149, 2.266, 2.044]
    b = [2.074, 2.065, 2.007, 2.003, 2.037]
    ratio = study.time_ratio(a, b)
    assert ratio['ratio'] == pytest.approx(stats.gmean(b) / stats.gmean(a))
    interval = stats.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval()
    assert (ratio['ci_low'], ratio['ci_high']) == pytest.approx(np.exp([interval.low,
                                                                        interval.high]))
    result = study.equivalence_test(a, b, 1.05, ratio=True)
    logs = study.equivalence_test(np.log(a), np.log(b), math.log(1.05))
    assert result['p_value'] == pytest.approx(logs['p_value'], rel=1e-12)
    assert result['difference'] == pytest.approx(stats.gmean(b) / stats.gmean(a))
    assert (result['ci_low'], result['ci_high']) == pytest.approx(
        np.exp([logs['ci_low'], logs['ci_high']]))
    assert result['equivalence_range'] == pytest.approx([1 / 1.05, 1.05])
    with pytest.raises(ValueError, match='ratio margin is above 1'):
        study.equivalence_test(a, b, 0.05, ratio=True)
    with pytest.raises(ValueError, match='positive difference'):
        study.equivalence_test(a, b, -0.1)


@pytest.mark.slow
@pytest.mark.parametrize('paired', [False, True])
def test_equivalence_size_at_the_margin_is_at_most_alpha(paired):
    """A true difference exactly at the margin (0.67 of the runs' std), 25 runs each, 4000
    simulated studies (standard error 0.34 points): equivalence is claimed at most 5% of the time
    (measured 4.2% Welch, 4.9% paired)."""
    rng = np.random.default_rng(6)
    claimed = 0
    for _ in range(4000):
        shared = rng.normal(0, 0.0015 * math.sqrt(0.5), 25) if paired else 0
        own = 0.0015 * (math.sqrt(0.5) if paired else 1)
        a = 0.94 + shared + rng.normal(0, own, 25)
        b = 0.941 + shared + rng.normal(0, own, 25)
        claimed += study.equivalence_test(a, b, 0.001, paired=paired)['equivalent']
    assert 0.035 <= claimed / 4000 <= 0.05 + 0.007


@pytest.mark.parametrize('paired', [False, True])
def test_power_is_that_of_simulated_studies(paired):
    """At runs_needed's answer the simulated rejection rate of the t-test is the power computed
    (4000 simulated studies: a standard error of 0.006; allowed 0.025)."""
    rng = np.random.default_rng(1)
    std = 0.0015
    difference = 0.0012
    correlation = 0.6
    runs = study.runs_needed(std, difference, paired=paired, correlation=correlation)
    shared = rng.normal(0, std * math.sqrt(correlation), (4000, runs)) if paired else 0
    own = std * (math.sqrt(1 - correlation) if paired else 1)
    a = shared + rng.normal(0, own, (4000, runs))
    b = difference + shared + rng.normal(0, own, (4000, runs))
    p = (stats.ttest_rel(b, a, axis=1) if paired else stats.ttest_ind(b, a, axis=1)).pvalue
    expected = study.statistical_power(runs, std, difference, paired=paired,
                                       correlation=correlation)
    assert expected >= 0.8
    assert np.mean(p < 0.05) == pytest.approx(expected, abs=0.025)


@pytest.mark.parametrize('p_values, adjusted', [
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made non-decreasing
    ([0.01, 0.04, 0.03, None, 0.005], [0.03, 0.06, 0.06, None, 0.02]),
    # an undefined test (None, or NaN) is no member of the family: 0.01 * 2, max(0.02, 0.04 * 1)
    ([0.01, float('nan'), 0.04], [0.02, float('nan'), 0.04]),
    ([None, 0.04, float('nan')], [None, 0.04, float('nan')])])
def test_holm_adjustment_by_hand(p_values, adjusted):
    assert study.holm(p_values) == pytest.approx(adjusted, nan_ok=True)


@pytest.mark.parametrize('std, difference, options, runs', [
    (1.0, 0.2, {}, 394), (1.0, 0.5, {}, 64), (1.0, 0.8, {}, 26),
    (1.0, 0.5, dict(paired=True, correlation=0.5), 34),
    (0.15, 0.08, {}, 57),  # "about 55 per arm", as a planner rounds it
    (1.0, 2.0, {}, 6), (1.0, 40.0, {}, 2), (1.0, 10, {}, 2),
    (1.0, 10, dict(paired=True, correlation=0.5), 3)])
def test_runs_needed_are_the_fewest_with_80_percent_power(std, difference, options, runs):
    """Cohen (1988), table 2.4.1, two-sided at 5%: 393 (his normal approximation; the noncentral t
    gives 394), 64, 26. Paired with correlation 0.5, d_z = 0.5 needs 34 pairs (G*Power 3). 10
    standard deviations: 2 runs, or 3 pairs (2 pairs have 1 degree of freedom: power 0.733)."""
    assert study.runs_needed(std, difference, **options) == runs
    assert study.statistical_power(runs, std, difference, **options) >= 0.8
    assert runs == 2 or study.statistical_power(runs - 1, std, difference, **options) < 0.8


def test_power_when_the_difference_is_many_standard_deviations():
    """0.9927 at 2 runs (scipy.stats.nct); scipy's nct.cdf of the lower tail is NaN at 3 and 4 runs
    (a noncentrality of 12 to 14): it is taken as the upper tail of -shift."""
    assert study.statistical_power(2, 1.0, 10) == pytest.approx(0.992746660, abs=1e-9)
    for runs in (3, 4, 5, 50):
        assert study.statistical_power(runs, 1.0, 10) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match='positive std'):
        study.runs_needed(0, 0.1)


@pytest.mark.slow
@pytest.mark.parametrize('truth,interval', [  # the interval of one study of 3 runs, normal noise
    (0.94, lambda rng: study.describe(simulated.noisy(rng, 0.94, 3).ravel())),
    (0.001, lambda rng: study.compare(*simulated.noisy(rng, [0.94, 0.941], 3, 0.0).T)),
    (0.001, lambda rng: study.compare(*simulated.noisy(rng, [0.94, 0.941], 3).T, paired=True)),
    (0.94, lambda rng: dict(ci_low=study.target_test(simulated.noisy(rng, 0.94, 3).ravel(),
                                                     0.94)['lower_bound'], ci_high=None))],
    ids=['mean', 'Welch', 'paired', 'target claim: one-sided lower bound'])
def test_mean_and_comparison_intervals_cover(truth, interval):
    """Student-t intervals on normal noise: 95% by construction; 1000 simulated studies at n = 3
    (standard error 0.7 points): allowed 92.5% (measured 94.5%, 96.0%, 95.5%, 93.6%)."""
    assert simulated.coverage(lambda rng: (interval(rng), None), truth, 1000, seed=3)[0] >= 0.925
