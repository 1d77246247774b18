"""The statistics on plain arrays (issue #26): compare, target_test and runs_needed against scipy,
R's published output and Cohen's tables; the intervals of fitted quantities against simulations of
known truth; functions that say why where there is no answer; the calibration error of simulated
ensembles; the streaming tally against the in-memory functions."""
import json
import math

import numpy as np
import pytest
from scipy import stats

from conftest import load_script, load_tool

import study  # noqa: E402  (the repository is on the path: conftest)
from studylib.stats import fits, inference, variance  # noqa: E402

# Student's sleep data (Student 1908; R's `sleep`): extra hours of sleep under two drugs, the same
# 10 patients. R 4.x, t.test(extra ~ group, data = sleep, paired = TRUE): t = -4.0621, df = 9,
# p-value = 0.002833, 95% CI -2.4598858 -0.7001142, mean difference -1.58; without paired
# (Welch): t = -1.8608, df = 17.776, p-value = 0.07939, 95% CI -3.3654832 0.2054832.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_the_scripts_interval_of_the_mean_is_students_t():
    """The scripts' summary (they need only torch): mean and std exact, the 95% interval's
    half-width Student's t's to the rounding of its table (n <= 25) and within the 0.4% its
    docstring states past it, on the sleep data repeated to each size."""
    summary = load_script('airbench94').mean_and_interval
    for n in range(2, 120):
        values = (SLEEP_1 * 12)[:n]
        result, sem = summary(values), stats.sem(values)
        assert result['n'] == n and result['mean'] == pytest.approx(np.mean(values), abs=1e-12)
        assert result['std'] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
        half_width = (result['ci95'][1] - result['ci95'][0]) / 2
        assert half_width == pytest.approx(stats.t.ppf(0.975, n - 1) * sem,
                                           rel=0.0025 if n <= 25 else 0.004), n

def test_paired_comparison_is_rs_on_students_sleep_data():
    result = study.compare(SLEEP_1, SLEEP_2, paired=True)
    assert result['test'] == 'paired t-test'
    assert result['difference'] == pytest.approx(1.58)
    assert (result['ci_low'], result['ci_high']) == pytest.approx((0.7001142, 2.4598858), abs=1e-7)
    assert result['p_value'] == pytest.approx(0.002833, abs=5e-7)
    assert result['correlation'] == pytest.approx(np.corrcoef(SLEEP_1, SLEEP_2)[0, 1])


def test_welch_comparison_is_rs_on_students_sleep_data():
    result = study.compare(SLEEP_1, SLEEP_2)
    assert result['test'] == "Welch's t-test" and 'correlation' not in result
    assert (result['ci_low'], result['ci_high']) == pytest.approx((-0.2054832, 3.3654832),
                                                                  abs=1e-7)
    assert result['p_value'] == pytest.approx(0.07939, abs=5e-6)


def test_comparison_agrees_with_scipy_and_its_effect_size_is_d_av():
    rng = np.random.default_rng(0)
    a, b = 0.94 + rng.normal(0, 0.0015, 12), 0.941 + rng.normal(0, 0.002, 9)
    welch = stats.ttest_ind(b, a, equal_var=False)
    result = study.compare(a, b, confidence=0.9)
    interval = welch.confidence_interval(0.9)
    assert (result['ci_low'], result['ci_high'], result['p_value']) == pytest.approx(
        (interval.low, interval.high, welch.pvalue), rel=1e-12)
    d_av = (b.mean() - a.mean()) / math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    assert result['effect_size'] == pytest.approx(d_av, rel=1e-12)
    assert study.compare(a[:9], b, paired=True)['effect_size'] == pytest.approx(
        (b.mean() - a[:9].mean()) / math.sqrt((a[:9].var(ddof=1) + b.var(ddof=1)) / 2))


def test_comparison_says_why_where_undefined_and_refuses_bad_pairs():
    assert study.compare([0.9], [0.91, 0.92])['reason'] == 'each side needs at least 2 runs'
    assert study.compare([0.9, 0.9], [0.9, 0.9])['p_value'] is None
    with pytest.raises(ValueError, match='paired samples'):
        study.compare([0.9, 0.91, 0.92], [0.9, 0.91], paired=True)
    with pytest.raises(ValueError, match='not finite'):
        study.compare([0.9, float('nan')], [0.9, 0.91])


def test_target_test_is_scipys_one_sided_t_test():
    values = [0.9402, 0.9411, 0.9398, 0.9405, 0.9409]
    result = study.target_test(values, 0.94)
    scipy_test = stats.ttest_1samp(values, 0.94, alternative='greater')
    assert result['p_value'] == pytest.approx(scipy_test.pvalue, rel=1e-12)
    assert result['lower_bound'] == pytest.approx(
        np.mean(values) - stats.t.ppf(0.95, 4) * stats.sem(values), rel=1e-12)
    assert result['lower_bound'] == pytest.approx(scipy_test.confidence_interval(0.95).low)
    assert study.target_test([0.94], 0.94)['reason'] == 'fewer than 2 runs'


# The record claims: nine runs about 94.05% and one that diverged at 10%; and ten runs whose
# two-sided 95% interval [0.93990, 0.94164] holds 0.94 while the one-sided p is 0.038.
NINE = [0.93947, 0.93986, 0.94011, 0.94037, 0.9405, 0.94063, 0.94082, 0.94121, 0.94153]
TEN = [0.93876, 0.93943, 0.93983, 0.94037, 0.94077, 0.9409, 0.94117, 0.94157, 0.94224, 0.94265]


def test_target_claim_counts_the_diverged_runs():
    """Without the diverged run p = 0.024, "above 0.94"; a record counts every run it trained, and
    with it (at the 10% it ended with) p = 0.827. The divergence rate 1 of 10 is given with its
    Clopper-Pearson interval: the beta quantiles B(0.025; 1, 10) and B(0.975; 2, 9)."""
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


def test_target_claim_and_its_bound_never_disagree():
    """The issue's ten runs: mean 0.94077, two-sided 95% interval [0.93990, 0.94164] (it holds
    0.94) and one-sided p = 0.0387: the bound given with the claim is the one-sided 95% bound,
    0.94006, above 0.94 as the claim is. Over 400 samples near the target, the bound is above the
    target exactly when p < 0.05."""
    result = study.target_test(TEN, 0.94)
    assert result['p_value'] == pytest.approx(0.038675, abs=1e-6)
    assert result['lower_bound'] == pytest.approx(0.9400619, abs=1e-7)
    assert 'ci_low' not in result
    rng = np.random.default_rng(4)
    for _ in range(400):
        result = study.target_test(0.9405 + rng.normal(0, 0.0015, 8), 0.94)
        assert (result['lower_bound'] > 0.94) == (result['p_value'] < 0.05)


def test_five_target_claims_need_holms_adjustment():
    """Five configurations truly at the target, 10 runs each (20,000 simulated studies, standard
    error 0.3 points): one at least reads "above" 22.6% of the time at 5% each, as the issue
    found (1 - 0.95^5 = 22.6%); with Holm's adjustment over the five, at most 5%."""
    rng = np.random.default_rng(5)
    values = 0.94 + rng.normal(0, 0.0015, (20000, 5, 10))
    p = stats.ttest_1samp(values, 0.94, axis=2, alternative='greater').pvalue
    assert np.mean((p < 0.05).any(axis=1)) == pytest.approx(1 - 0.95 ** 5, abs=0.01)
    adjusted = np.array([study.holm(list(row)) for row in p])
    assert np.mean((adjusted < 0.05).any(axis=1)) <= 0.05 + 0.005


# Equivalence (TOST)

def welch_by_hand(a, b, shift):
    """Welch's t statistic of mean(b) - mean(a) - shift and its Satterthwaite degrees of freedom."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    freedom = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return (np.mean(b) - np.mean(a) - shift) / math.sqrt(va + vb), freedom


def test_equivalence_is_two_one_sided_t_tests():
    """Welch: each one-sided p from the t distribution by hand at the shifted means, the 90%
    interval mean difference +- t(0.95) * se; equivalence exactly when that interval lies inside
    the margin."""
    a = [0.9410, 0.9395, 0.9402, 0.9421, 0.9388, 0.9407]
    b = [0.9415, 0.9401, 0.9398, 0.9409, 0.9412]
    result = study.equivalence_test(a, b, 0.002)
    t_low, freedom = welch_by_hand(a, b, -0.002)
    t_high, _ = welch_by_hand(a, b, 0.002)
    assert result['p_lower'] == pytest.approx(stats.t.sf(t_low, freedom), rel=1e-10)
    assert result['p_upper'] == pytest.approx(stats.t.cdf(t_high, freedom), rel=1e-10)
    assert result['p_value'] == max(result['p_lower'], result['p_upper'])
    se = math.sqrt(np.var(a, ddof=1) / 6 + np.var(b, ddof=1) / 5)
    half = stats.t.ppf(0.95, freedom) * se
    difference = np.mean(b) - np.mean(a)
    assert (result['ci_low'], result['ci_high']) == pytest.approx((difference - half,
                                                                   difference + half))
    assert result['equivalent'] and result['ci_high'] < 0.002 and result['confidence'] == 0.9
    narrow = study.equivalence_test(a, b, 0.0005)
    assert not narrow['equivalent'] and narrow['ci_high'] > 0.0005


def test_paired_equivalence_on_students_sleep_data():
    """Differences of Student's sleep data: mean 1.58, sd 1.2300, 9 degrees of freedom. Within a
    margin of 2 hours: t = (1.58 + 2) / se and (1.58 - 2) / se; p is the larger one-sided p."""
    se = np.std(np.subtract(SLEEP_2, SLEEP_1), ddof=1) / math.sqrt(10)
    result = study.equivalence_test(SLEEP_1, SLEEP_2, 2.0, paired=True)
    assert result['p_lower'] == pytest.approx(stats.t.sf((1.58 + 2) / se, 9), rel=1e-9)
    assert result['p_upper'] == pytest.approx(stats.t.cdf((1.58 - 2) / se, 9), rel=1e-9)
    assert result['p_value'] == pytest.approx(stats.t.cdf((1.58 - 2) / se, 9), rel=1e-9)
    assert (result['ci_low'], result['ci_high']) == pytest.approx(
        (1.58 - stats.t.ppf(0.95, 9) * se, 1.58 + stats.t.ppf(0.95, 9) * se))
    assert result['test'] == 'paired TOST' and result['equivalent'] is False


def test_equivalence_of_times_is_on_log_seconds():
    """ratio=True: the same tests on log seconds, within [1/1.05, 1.05]; the ratio and its
    interval are of geometric means."""
    a, b = [2.039, 2.039, 2.149, 2.266, 2.044], [2.074, 2.065, 2.007, 2.003, 2.037]
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
    """A true difference exactly at the margin (0.1 points, 0.67 of the runs' std), 25 runs each
    (4000 simulated studies, standard error 0.34 points): equivalence is claimed at most 5% of the
    time (measured 4.2% Welch, 4.9% paired; at 5 runs TOST is far more conservative, 0.3% and
    2.3%, as its 90% interval is then wider than the margin's range)."""
    rng = np.random.default_rng(6)
    claimed = 0
    for _ in range(4000):
        shared = rng.normal(0, 0.0015 * math.sqrt(0.5), 25) if paired else 0
        own = 0.0015 * (math.sqrt(0.5) if paired else 1)
        a = 0.94 + shared + rng.normal(0, own, 25)
        b = 0.941 + shared + rng.normal(0, own, 25)
        claimed += study.equivalence_test(a, b, 0.001, paired=paired)['equivalent']
    assert 0.035 <= claimed / 4000 <= 0.05 + 0.007


def test_equivalence_says_why_where_undefined():
    assert study.equivalence_test([0.9], [0.91, 0.92], 0.01)['reason'] == \
        'each side needs at least 2 runs'
    flat = study.equivalence_test([0.9, 0.9], [0.9, 0.9], 0.01)
    assert flat['equivalent'] is None and 'no spread' in flat['reason']
    with pytest.raises(ValueError, match='paired samples'):
        study.equivalence_test([0.9, 0.91, 0.92], [0.9, 0.91], 0.01, paired=True)


def test_runs_needed_reproduces_cohens_table():
    """Cohen (1988), table 2.4.1: two-sided t-test at 5%, power 0.80, n per group 393 for d = 0.2,
    64 for d = 0.5, 26 for d = 0.8 (his values rounded from the normal approximation give 393;
    the exact noncentral t gives 394). Paired with correlation 0.5: the differences' std equals the
    runs', so d_z = 0.5 needs 34 pairs (G*Power 3)."""
    assert [study.runs_needed(1.0, d) for d in (0.2, 0.5, 0.8)] == [394, 64, 26]
    assert study.runs_needed(1.0, 0.5, paired=True, correlation=0.5) == 34
    assert study.runs_needed(0.15, 0.08) == 57  # the "about 55 per arm"
    with pytest.raises(ValueError, match='positive std'):
        study.runs_needed(0, 0.1)


@pytest.mark.parametrize('paired', [False, True])
def test_power_is_that_of_simulated_studies(paired):
    """At runs_needed's answer the simulated rejection rate of the t-test is the power computed
    (4000 simulated studies: a standard error of 0.006; allowed 0.025)."""
    rng = np.random.default_rng(1)
    std, difference, correlation = 0.0015, 0.0012, 0.6
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


def test_holm_adjustment_by_hand():
    """m = 4 defined p-values: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06,
    0.04, made non-decreasing: 0.02, 0.03, 0.06, 0.06."""
    assert study.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx(
        [0.03, 0.06, 0.06, None, 0.02])


def test_holm_leaves_undefined_p_values_out_of_the_family():
    """A NaN p-value (a test that could not be made) is not a member of the family: the two
    defined ones are adjusted as a family of 2 (0.01 * 2, then max(0.02, 0.04 * 1)), and the NaN
    stays NaN where None stays None. Before: [0.03, 1.0, 1.0] (NaN counted, and sorted last)."""
    adjusted = study.holm([0.01, float('nan'), 0.04])
    assert adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.04)
    assert math.isnan(adjusted[1])
    assert study.holm([None, 0.04, float('nan')])[0] is None


def test_runs_needed_when_the_difference_is_many_standard_deviations():
    """A difference of 10 standard deviations: at 2 runs per configuration (2 degrees of freedom)
    the two-sided t-test's power is 0.9927 (scipy.stats.nct), so 2 runs suffice. scipy's nct.cdf
    of the lower tail is NaN at 3 and 4 runs (a noncentrality of 12 to 14), which the search read
    as "not enough" and answered 4; the lower tail is taken as the upper tail of -shift."""
    assert study.statistical_power(2, 1.0, 10) == pytest.approx(0.992746660, abs=1e-9)
    for runs in (3, 4, 5, 50):
        assert study.statistical_power(runs, 1.0, 10) == pytest.approx(1.0, abs=1e-9)
    assert study.runs_needed(1, 10) == 2
    # paired, 2 pairs: 1 degree of freedom, power 0.733 (nct.sf); 3 pairs: 0.9999996
    assert study.runs_needed(1, 10, paired=True, correlation=0.5) == 3
    for d in (0.2, 0.5, 0.8, 2.0, 40.0):  # a monotone answer over a wide range of differences
        runs = study.runs_needed(1.0, d)
        assert study.statistical_power(runs, 1.0, d) >= 0.8
        assert runs == 2 or study.statistical_power(runs - 1, 1.0, d) < 0.8


def test_time_ratio_is_the_ratio_of_geometric_means():
    a, b = [3.0, 3.2, 3.1], [2.4, 2.5, 2.6]
    result = study.time_ratio(a, b)
    assert result['ratio'] == pytest.approx(stats.gmean(b) / stats.gmean(a))
    interval = stats.ttest_ind(np.log(b), np.log(a), equal_var=False).confidence_interval()
    assert (result['ci_low'], result['ci_high']) == pytest.approx(np.exp([interval.low,
                                                                          interval.high]))


# The intervals of fitted quantities

def test_vectorized_fits_equal_the_least_squares_fit():
    rng = np.random.default_rng(2)
    for grid, law in (((5, 10, 20, 40), (0.03, 0.45, -0.75)), ((10, 20, 40), (0.058, 0.3, -1.2))):
        grid = np.array(grid, dtype=float)
        errors = law[0] + law[1] * grid ** law[2] + rng.normal(0, 0.0009, (50, grid.size))
        a, b, c, falls = fits.fit_power_laws(grid, errors)
        for row in range(50):
            law_fit = fits.fit_power_law(grid, errors[row])
            assert falls[row]
            for error in (0.06, 0.065):
                expected = law_fit.epochs_for_error(error)
                found = float(fits._epochs_for_errors(a[row], b[row], c[row], error))
                assert found == pytest.approx(expected, rel=1e-7) if math.isfinite(expected) \
                    else found == expected


@pytest.mark.slow
def test_interval_coverage_on_simulated_studies():
    """Epochs to 94% on law A (error 0.03 + 0.45 E^-0.75, grid 5 to 40, noise 0.15 points, runs
    paired by seed with a correlation of 0.5) at 3 runs per cell, 100 simulated studies: with 100
    studies a coverage of 95% shows as at least 89% with probability 0.998 (binomial). The
    interval is narrower than the former one (each cell drawn alone from its own Student t) on
    the same studies."""
    coverage = load_tool('interval_coverage')
    case = coverage.cases()['epochs to 94%, law A'][0]
    truth, simulate = case('normal')
    found = coverage.coverage(simulate, truth, 3, 100, seed=7, draws=1000)
    assert found['ours'] >= 0.89
    assert found['width'] < found['former_width']


@pytest.mark.slow
def test_speedup_interval_covers_at_three_runs_and_is_narrower_than_before():
    """The speedup at 10 epochs on law A, 3 runs per cell paired by seed, 200 simulated studies
    (the full table, 400 studies: 93.8% covered, mean width 8.6 points against the former
    interval's 24.1 at 100% coverage): with 200 studies a coverage of 95% shows as at least 91% with probability
    0.99 (binomial); the width is under half the former one's on the same studies."""
    coverage = load_tool('interval_coverage')
    truth, simulate = coverage.cases()['speedup at 10 epochs, law A'][0]('normal')
    found = coverage.coverage(simulate, truth, 3, 200, seed=12, draws=1000)
    assert found['ours'] >= 0.91
    assert found['width'] < found['former_width'] / 2


def test_mean_and_comparison_intervals_cover():
    """Student-t intervals on normal noise: 95% by construction; 1000 simulated studies at n = 3
    (standard error 0.7 points): allowed 92.5%. The one-sided bound of a target claim too."""
    coverage = load_tool('interval_coverage')
    for name in ('mean (Student t)', "compare, Welch's t (independent runs)", 'compare, paired t',
                 'target claim: one-sided 95% lower bound (width: mean - bound)'):
        truth, simulate = coverage.cases()[name][0]('normal')
        assert coverage.coverage(simulate, truth, 3, 1000, seed=3)['ours'] >= 0.925, name


def law_a_runs(runs, seed, grid=(5, 10, 20, 40)):
    rng = np.random.default_rng(seed)
    return {e: 1 - (0.03 + 0.45 * e ** -0.75) + rng.normal(0, 0.0015, runs) for e in grid}


def test_interval_results_say_why_where_there_is_no_answer():
    flat = {40: [0.9401] * 2 + [0.9400, 0.9402], 80: [0.9405, 0.9404, 0.9406, 0.9405],
            160: [0.9399, 0.9398, 0.9400, 0.9399]}
    result = study.epochs_to_accuracy_interval(flat, 0.94)
    assert result['estimate'] is None and not result['reliable']
    assert 'do not fall' in result['reason']
    diverged = {10: [0.1] * 3, 20: [0.1] * 3, 40: [0.1] * 3}
    result = study.effective_speedup_interval(diverged, [0.1] * 3, 20)
    assert result['estimate'] is None and 'do not fall' in result['reason']
    two_counts = study.epochs_to_accuracy_interval({10: [0.93, 0.931], 20: [0.94, 0.941]}, 0.935)
    assert two_counts['estimate'] is None and '3 distinct epoch counts' in two_counts['reason']
    single_runs = study.epochs_to_accuracy_interval(
        {e: values[:1] for e, values in law_a_runs(1, 4).items()}, 0.94)
    assert single_runs['ci_low'] is None and 'single run' in single_runs['reason']
    with pytest.raises(ValueError, match='not finite'):
        study.epochs_to_accuracy([40, 80, 160], [0.9401, float('nan'), 0.9399], 0.94)


def test_unreachable_targets_and_extrapolations_are_flagged():
    runs = law_a_runs(10, 5)
    never = study.epochs_to_accuracy_interval(runs, 0.975)  # error 0.025, below c = 0.03
    assert never['estimate'] is None and 'never reached' in never['reason']
    assert never['ci_high'] is None and not never['reliable']
    faster = 1 - (0.03 + 0.45 * 50 ** -0.75) + np.random.default_rng(6).normal(0, 0.0015, 10)
    beyond = study.effective_speedup_interval(runs, faster, 40)
    assert beyond['extrapolated'] and not beyond['reliable']
    assert beyond['equivalent_epochs'] > 40 and 'extrapolation' in beyond['reason']
    at_25 = 1 - (0.03 + 0.45 * 25 ** -0.75) + np.random.default_rng(6).normal(0, 0.0015, 10)
    inside = study.effective_speedup_interval(runs, at_25, 20)
    assert not inside['extrapolated'] and inside['reliable']
    assert 20 < inside['equivalent_epochs'] < 40
    assert json.dumps(never, allow_nan=False)  # no inf or nan: JSON holds every result


def test_fewer_than_three_runs_per_cell_is_not_reliable():
    result = study.epochs_to_accuracy_interval(law_a_runs(2, 8), 0.94)
    assert result['ci_low'] is not None and not result['reliable']
    assert 'coverage was measured from 3 runs' in result['reason']
    assert study.epochs_to_accuracy_interval(law_a_runs(3, 8), 0.94)['reliable']


def test_cells_without_spread_are_not_reliable():
    """Runs that repeat one value give a variance of 0: before, the interval had no width and was
    marked reliable. Now such an interval says why it is not; one cell without spread among
    others is flagged too (its spread is taken from the others, which normal runs never make 0)."""
    law = fits.PowerLaw(a=-0.75, b=0.45, c=0.03)
    exact = {e: [1 - float(law.error_at(e))] * 3 for e in (5, 10, 20, 40)}
    result = study.epochs_to_accuracy_interval(exact, 0.94)
    assert result['ci_low'] == pytest.approx(result['ci_high'])
    assert not result['reliable'] and 'no cell has any spread' in result['reason']
    one_flat = {**law_a_runs(3, 9), 40: exact[40]}
    result = study.epochs_to_accuracy_interval(one_flat, 0.94, paired=True)
    assert not result['reliable'] and '1 of 4 cells have runs without spread' in result['reason']


def test_lack_of_fit_is_the_f_test_of_the_means_misfit_against_the_runs_spread():
    """By hand: the misfit n * sum (mean - fit)^2 over k - 3 = 1 degree of freedom, against the
    pooled within-cell variance (unpaired) or the two-way layout's residual mean square (paired);
    p from scipy's F distribution."""
    runs = law_a_runs(4, 10)
    epochs = sorted(runs)
    cells = [runs[e] for e in epochs]
    means = np.array([cell.mean() for cell in cells])
    law = fits.fit_power_law(epochs, 1 - means)
    misfit = 4 * ((1 - means - law.error_at(epochs)) ** 2).sum() / 1
    pooled = sum(((cell - cell.mean()) ** 2).sum() for cell in cells) / 12
    result = fits.lack_of_fit(epochs, cells)
    assert result['statistic'] == pytest.approx(misfit / pooled, rel=1e-9)
    assert result['p_value'] == pytest.approx(stats.f.sf(misfit / pooled, 1, 12), rel=1e-9)
    table = np.column_stack(cells)
    residual = table - table.mean(1, keepdims=True) - table.mean(0) + table.mean()
    paired = fits.lack_of_fit(epochs, cells, paired=True)
    assert paired['freedom'] == [1, 9]
    assert paired['statistic'] == pytest.approx(misfit / ((residual ** 2).sum() / 9), rel=1e-9)
    assert fits.lack_of_fit(epochs[:3], cells[:3])['reason'].startswith('3 epoch counts')


def test_lack_of_fit_rejects_a_curve_that_is_no_power_law():
    """Error 0.055 + 0.25 exp(-epochs / 6) at 5, 10, 20, 40 epochs, 3 runs per cell: the test
    rejects the power law in each of 20 simulated studies (measured: 400 of 400), and marks the
    intervals derived from it; on law A it rejects about 5% (measured 7.0% at n = 3, 6.3% at
    n = 5 and 10, 400 studies each: an approximate F test, the law being nonlinear)."""
    rng = np.random.default_rng(10)
    for _ in range(20):
        runs = {e: 1 - (0.055 + 0.25 * math.exp(-e / 6)) + rng.normal(0, 0.0015, 3)
                for e in (5, 10, 20, 40)}
        result = study.epochs_to_accuracy_interval(runs, 0.94, draws=500)
        assert result['lack_of_fit']['p_value'] < 0.05
        assert not result['reliable'] and 'the power law does not fit' in result['reason']


# Variance and calibration

def simulated_ensemble(runs, examples=10000, classes=10, temperature=1.0, seed=0):
    """Runs that each predict example i's class from its probabilities pi_i (Dirichlet), and labels
    drawn from pi_i ** temperature (normalized): temperature 1 is calibrated as runs grow, 0.6
    makes the labels less certain than the votes (an over-confident ensemble)."""
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet(np.full(classes, 0.15), examples)
    cumulative = probabilities.cumsum(axis=1)
    predictions = np.minimum((rng.random((runs, examples, 1)) > cumulative[None]).sum(axis=2),
                             classes - 1)
    tempered = probabilities ** temperature
    tempered /= tempered.sum(axis=1, keepdims=True)
    labels = np.minimum((rng.random((examples, 1)) > tempered.cumsum(axis=1)).sum(axis=1),
                        classes - 1)
    return predictions, labels


def test_calibration_bins_are_what_they_say():
    """A zero-vote level holding 80% of the pairs and ten levels of 2% each, in 5 bins: the zero
    level is a bin alone and the ten share the other 4 (6, 6, 4, 4%); the former rule (level v to
    bin floor(B * F(v))) put the ten in one and used 2 of the 5. A simulated ensemble of 100 runs
    uses 15 of its 15 bins, and the result lists them."""
    pairs = np.array([80] + [2] * 10)
    binning = variance.equal_mass_bins(pairs, 5)
    used = variance.bins_used(pairs, binning, 10)
    assert [b['share'] for b in used] == pytest.approx([0.8, 0.06, 0.06, 0.04, 0.04])
    assert (used[1]['low'], used[1]['high']) == (0.1, 0.3)
    coverage = load_tool('interval_coverage')
    halves, labels = coverage.simulated_halves(100, 1.0, np.random.default_rng(14))
    entry = variance.split_half_calibration_error(halves, labels)[0]
    assert entry['bins_used'] == [15, 15] and len(entry['bins']) == 15
    assert sum(b['share'] for b in entry['bins']) == pytest.approx(1.0)


@pytest.mark.slow
def test_calibration_error_means_the_same_at_100_and_1000_runs():
    """An ensemble calibrated in the limit (10,000 examples, 10 classes), 40 simulated test sets
    at each size: the split-half estimate's mean at 100 and at 1000 runs agree within 3 standard
    errors of their difference (measured 0.0218 and 0.0216, docs/studies.md), and each set's
    interval holds the other size's mean in at least 34 of 40 (measured coverage 98 to 100%); the
    plug-in estimate of the same runs falls from 0.031 to 0.018 (the issue's finding). An
    over-confident ensemble (labels from pi^0.6) reads about 0.30 at both sizes, far above the
    level of a calibrated one."""
    coverage = load_tool('interval_coverage')
    found = {}
    for runs in (100, 1000):
        rng = np.random.default_rng(runs)
        entries, plug_ins = [], []
        for _ in range(40):
            halves, labels = coverage.simulated_halves(runs, 1.0, rng)
            entries.append(variance.split_half_calibration_error(halves, labels, rng=rng)[0])
            votes = halves[0][0] + halves[1][0]
            binning = variance.equal_mass_bins(variance.level_counts(votes, runs), 15)
            plug_ins.append(np.abs(variance.deviations(votes, votes / runs, labels, binning)
                                   .sum(0)).sum() / labels.size)
        found[runs] = entries, np.array([e['estimate'] for e in entries]), np.mean(plug_ins)
    difference = found[100][1].mean() - found[1000][1].mean()
    standard_error = math.sqrt(found[100][1].var(ddof=1) / 40 + found[1000][1].var(ddof=1) / 40)
    assert abs(difference) < 3 * standard_error
    for runs, other in ((100, 1000), (1000, 100)):
        mean = found[other][1].mean()
        assert sum(e['ci_low'] <= mean <= e['ci_high'] for e in found[runs][0]) >= 34
    assert found[100][2] > 0.027 and found[1000][2] < 0.021
    for runs in (100, 1000):
        halves, labels = coverage.simulated_halves(runs, 0.6, np.random.default_rng(runs))
        tally = study.EnsembleTally(labels, 10)
        tally.votes[:] = [votes for votes, _ in halves]
        tally.accuracies = [0.0] * runs
        result = tally.calibration_error()
        assert 0.27 < result['estimate'] < 0.33
        assert result['ci_low'] > 5 * result['calibrated_upper']


def test_calibration_error_below_100_runs_says_it_does_not_compare():
    predictions, labels = simulated_ensemble(20, examples=2000, seed=15)
    result = study.calibration_error(predictions, labels)
    assert result['comparable'] is False and 'not 50' in result['note']
    assert result['binning_runs'] == 10
    assert study.calibration_error(predictions[:1], labels)['estimate'] is None


def test_tally_one_run_at_a_time_equals_the_arrays():
    rng = np.random.default_rng(12)
    labels = rng.integers(0, 10, 500)
    predictions = np.where(rng.random((40, 500)) < 0.8, labels, rng.integers(0, 10, (40, 500)))
    tally = study.EnsembleTally(labels, 10)
    for run in predictions:
        tally.add(run)
    correct = predictions == labels
    summary = tally.summary()
    assert summary['distribution_wise_variance'] == pytest.approx(
        variance.distribution_wise_variance(correct), rel=1e-12)
    assert summary['test_set_std'] == pytest.approx(variance.test_set_std(correct.mean(axis=1)))
    assert summary['calibration']['plug_in'] == pytest.approx(
        variance.class_aggregated_calibration_error(predictions, labels), rel=1e-12)
    halves = [(variance.ensemble_votes(predictions[h::2], 10), 20) for h in (0, 1)]
    direct = variance.split_half_calibration_error(halves, labels,
                                                   rng=np.random.default_rng(0))[0]
    assert summary['calibration']['estimate'] == pytest.approx(direct['estimate'], rel=1e-12)
    assert summary['calibration']['ci_high'] == pytest.approx(direct['ci_high'], rel=1e-12)
    low, high = variance.sample_variance_interval(correct.mean(axis=1), 0.95)
    assert summary['test_set_std_ci'] == pytest.approx([math.sqrt(low), math.sqrt(high)])
    assert 'normal' in summary['test_set_std_ci_assumes']


def test_negative_distribution_wise_variance_has_no_std_but_an_interval():
    labels = np.zeros(2, dtype=np.int64)
    tally = study.EnsembleTally(labels, 2)
    for run in ([0, 1], [1, 0], [0, 1], [1, 0]):  # every run right on exactly one example
        tally.add(np.array(run))
    summary = tally.summary()
    assert summary['distribution_wise_variance'] == pytest.approx(-1 / 3)
    assert summary['distribution_wise_std'] is None and 'below 0' in \
        summary['distribution_wise_note']
    assert summary['distribution_wise_std_ci'][0] == 0.0
