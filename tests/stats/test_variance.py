"""studylib.stats.variance: the test-set and distribution-wise stds (Jordan 2024), the calibration
error (Jiang et al. 2022), its split-half estimate, the streaming tally equal to the arrays."""
import math
import statistics

import numpy as np
import pytest
import torch

import study
from simulated import simulated_halves
from studylib.stats import variance
from studylib.stats.variance import (class_aggregated_calibration_error, distribution_wise_std,
                                     distribution_wise_variance)


def test_the_variances_are_their_definitions():
    """The test-set std is the sample std of the runs' accuracies; Jordan (2024) Eq. 3 equals
    1/(n(n-1)) * sum over i != j of the examples' covariances over runs (ddof=1)."""
    correct = np.random.default_rng(5).random((9, 6)) < 0.7
    accuracies = correct.mean(axis=1)
    assert variance.test_set_std(accuracies) == pytest.approx(statistics.stdev(accuracies),
                                                              rel=1e-12)
    covariance = np.cov(correct.T.astype(float))
    mean_off_diagonal = (covariance.sum() - np.trace(covariance)) / (6 * 5)
    assert distribution_wise_variance(correct) == pytest.approx(mean_off_diagonal, rel=1e-12)


def test_independent_errors_have_no_distribution_wise_variance():
    """Each example correct at its own fixed rate, independently: the truth is 0. The estimate's
    standard error is about Var(test accuracy) * sqrt(2 / (R - 1)) (a sample variance's): allow 4,
    while the test-set variance itself is 14 away from 0."""
    rng = np.random.default_rng(6)
    runs = 400
    examples = 2000
    correct = rng.random((runs, examples)) < rng.uniform(0.5, 1.0, examples)
    test_variance = variance.test_set_std(correct.mean(axis=1)) ** 2
    assert abs(distribution_wise_variance(correct)) < 4 * test_variance * math.sqrt(2 / (runs - 1))


def test_shared_shift_between_runs_is_recovered():
    """Run r is correct on example i with probability p_i + d_r, d_r ~ N(0, s^2) shared by all
    examples: the distribution-wise variance is the variance of d (its sample variance here).
    Given d, the estimate's error comes from the Bernoulli noise e (Var(e_r) = v = mean p(1-p) /
    n): about v * sqrt(2 / R) from its sample variance plus 2 * sqrt(Var(d) * v / R) from its
    covariance with d; allow 4 of that. Here v = Var(d): the test-set variance is twice the
    shift's."""
    rng = np.random.default_rng(7)
    runs = 10000
    examples = 1000
    rates = rng.uniform(0.6, 0.9, examples)
    noise_variance = np.mean(rates * (1 - rates)) / examples
    shifts = rng.normal(0, math.sqrt(noise_variance), runs)
    correct = rng.random((runs, examples)) < rates + shifts[:, None]
    shift_variance = shifts.var(ddof=1)
    standard_error = (noise_variance * math.sqrt(2 / runs)
                      + 2 * math.sqrt(shift_variance * noise_variance / runs))
    estimate = distribution_wise_variance(correct)
    assert abs(estimate - shift_variance) < 4 * standard_error
    assert variance.test_set_std(correct.mean(axis=1)) ** 2 > 1.5 * shift_variance
    assert distribution_wise_std(correct) == pytest.approx(math.sqrt(estimate))


def test_a_negative_estimate_has_no_std_but_an_interval():
    """Two examples, each run right on exactly one: test-set variance 0, each example's 4/3 * 0.5 *
    0.5 = 1/3 (ddof=1), so var = 2/1 * (0 - (1/3 + 1/3) / 2^2) = -1/3: std 0, or none (tally)."""
    runs = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])  # correct, or predictions of labels 0
    assert distribution_wise_variance(runs) == pytest.approx(-1 / 3)
    assert distribution_wise_std(runs) == 0.0
    tally = study.EnsembleTally(np.zeros(2, dtype=np.int64), 2)
    for run in runs:
        tally.add(run)
    summary = tally.summary()
    assert summary['distribution_wise_variance'] == pytest.approx(-1 / 3)
    assert summary['distribution_wise_std'] is None
    assert 'below 0' in summary['distribution_wise_note']
    assert summary['distribution_wise_std_ci'][0] == 0.0


def test_variance_accepts_torch_and_refuses_bad_input():
    correct = torch.rand(50, 30, generator=torch.Generator().manual_seed(8)) < 0.8
    assert distribution_wise_std(correct) == distribution_wise_std(correct.numpy())
    with pytest.raises(ValueError, match='runs x test examples'):
        distribution_wise_variance(np.ones(10))
    with pytest.raises(ValueError, match='0/1'):
        distribution_wise_variance(np.full((3, 3), 0.5))


# 4 runs, 2 classes, 4 examples each predicted class 0 by 3 runs (confidence 0.75 for class 0,
# 0.25 for class 1), labels 0, 0, 0, 1: 3/4 of the class-0 pairs and 1/4 of the class-1 pairs are
# right, exactly as confident as the ensemble: CACE 0
CALIBRATED = ([[0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]], [0, 0, 0, 1])
# 3 examples, 3 classes, 4 runs. Votes per example (classes 0, 1, 2): (3, 1, 0), (0, 3, 1),
# (3, 0, 1); labels 0, 2, 0. Pairs (example, class) by confidence level q:
#   q = 0:    (0,2) (1,0) (2,1), none labelled:            |0 - 0 * 3|    = 0
#   q = 0.25: (0,1) (1,2) (2,2), one labelled, (1,2):      |1 - 0.25 * 3| = 0.25
#   q = 0.75: (0,0) (1,1) (2,0), two labelled:             |2 - 0.75 * 3| = 0.25
# CACE = (0 + 0.25 + 0.25) / 3 examples = 1/6. One bin pools every pair: 3 labels against
# confidences summing to 3, so CACE = 0.
BY_HAND = ([[0, 1, 2], [0, 1, 0], [0, 2, 0], [1, 1, 0]], [0, 2, 0])


@pytest.mark.parametrize('ensemble, options, expected', [
    (CALIBRATED, dict(bins=None), 0), (CALIBRATED, dict(bins=2), 0),
    (BY_HAND, dict(bins=None), 1 / 6), (BY_HAND, dict(bins=None, num_classes=10), 1 / 6),
    (BY_HAND, dict(bins=1), 0)])
def test_cace_computed_by_hand(ensemble, options, expected):
    predictions, labels = ensemble
    assert class_aggregated_calibration_error(np.array(predictions), np.array(labels),
                                              **options) == pytest.approx(expected, abs=1e-15)


def test_cace_of_a_sampled_calibrated_ensemble_is_within_its_noise():
    """Each example labelled with a random run's prediction: calibrated in expectation. Each level
    v's term sum (1[y_i = k] - q) has variance at most M_v q_v (1 - q_v) (M_v pairs at confidence
    q_v): allow 4 standard deviations per level. Majority labels (under-confident) are far out."""
    rng = np.random.default_rng(9)
    runs = 8
    examples = 5000
    classes = 10
    probabilities = rng.dirichlet(np.full(classes, 0.3), examples)
    cumulative = probabilities.cumsum(axis=1)
    draws = rng.random((runs, examples, 1))
    predictions = np.minimum((draws > cumulative[None]).sum(axis=2), classes - 1)
    labels = predictions[rng.integers(0, runs, examples), np.arange(examples)]
    votes = np.stack([(predictions == k).sum(axis=0) for k in range(classes)], axis=1)
    pairs = np.bincount(votes.ravel(), minlength=runs + 1)
    levels = np.arange(runs + 1) / runs
    noise = np.sqrt(pairs * levels * (1 - levels)).sum() / examples
    assert class_aggregated_calibration_error(predictions, labels, bins=None) < 4 * noise
    majority = votes.argmax(axis=1)
    assert class_aggregated_calibration_error(predictions, majority, bins=None) > 10 * noise


def test_calibration_bins_are_what_they_say():
    """A zero-vote level holding 80% of the pairs and ten levels of 2% each, in 5 bins: the zero
    level is a bin alone and the ten share the other 4 (6, 6, 4, 4%). A simulated ensemble of 100
    runs uses 15 of its 15 bins, and the result lists them."""
    pairs = np.array([80] + [2] * 10)
    binning = variance.equal_mass_bins(pairs, 5)
    used = variance.bins_used(pairs, binning, 10)
    assert [b['share'] for b in used] == pytest.approx([0.8, 0.06, 0.06, 0.04, 0.04])
    assert (used[1]['low'], used[1]['high']) == (0.1, 0.3)
    halves, labels = simulated_halves(100, 1.0, np.random.default_rng(14))
    entry = variance.split_half_calibration_error(halves, labels)[0]
    assert entry['bins_used'] == [15, 15] and len(entry['bins']) == 15
    assert sum(b['share'] for b in entry['bins']) == pytest.approx(1.0)


@pytest.mark.slow
def test_calibration_error_means_the_same_at_100_and_1000_runs():
    """An ensemble calibrated in the limit, 40 simulated test sets at each size: the split-half
    estimate's means at 100 and 1000 runs agree within 3 standard errors (measured 0.0218 and
    0.0216), each set's interval holds the other size's mean in 34 of 40 or more (measured 98 to
    100%); the plug-in estimate falls from 0.031 to 0.018 (its bias). An over-confident ensemble
    (labels from pi^0.6) reads about 0.30 at both sizes, far above a calibrated one's level."""
    found = {}
    for runs in (100, 1000):
        rng = np.random.default_rng(runs)
        entries = []
        plug_ins = []
        for _ in range(40):
            halves, labels = simulated_halves(runs, 1.0, rng)
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
        halves, labels = simulated_halves(runs, 0.6, np.random.default_rng(runs))
        tally = study.EnsembleTally(labels, 10)
        tally.votes[:] = [votes for votes, _ in halves]
        tally.accuracies = [0.0] * runs
        result = tally.calibration_error()
        assert 0.27 < result['estimate'] < 0.33
        assert result['ci_low'] > 5 * result['calibrated_upper']


def test_calibration_error_below_100_runs_says_it_does_not_compare():
    rng = np.random.default_rng(15)
    labels = rng.integers(0, 10, 2000)
    predictions = np.where(rng.random((20, 2000)) < 0.8, labels, rng.integers(0, 10, (20, 2000)))
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
    direct = variance.split_half_calibration_error(halves, labels, rng=np.random.default_rng(0))[0]
    assert summary['calibration']['estimate'] == pytest.approx(direct['estimate'], rel=1e-12)
    assert summary['calibration']['ci_high'] == pytest.approx(direct['ci_high'], rel=1e-12)
    low, high = variance.sample_variance_interval(correct.mean(axis=1), 0.95)
    assert summary['test_set_std_ci'] == pytest.approx([math.sqrt(low), math.sqrt(high)])
    assert 'normal' in summary['test_set_std_ci_assumes']
