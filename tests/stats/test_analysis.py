"""studylib's analysis (issue #20): power-law fits and epochs to a target, the paper's effective
speedups recomputed from its raw table, their intervals over runs, distribution-wise variance
(Jordan 2024) and the class-aggregated calibration error (Jiang et al. 2022). All on numbers or
seeded synthetic data: no training."""
import math
import os
import statistics
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import REPO, load_tool

if REPO not in sys.path:
    sys.path.insert(0, REPO)

from studylib.stats.fits import (PowerLaw, effective_speedup, effective_speedup_interval,  # noqa: E402
                           epochs_to_accuracy, epochs_to_accuracy_interval, fit_power_law)
from studylib import analysis, markdown  # noqa: E402
from studylib.config import Config  # noqa: E402
from studylib.stats import variance  # noqa: E402  (its test_set_std would be collected as a test)
from studylib.stats.variance import (class_aggregated_calibration_error,  # noqa: E402
                               distribution_wise_std, distribution_wise_variance)


PAPER = load_tool('paper_speedups')
EPOCHS = [10, 20, 40, 80]
LAW = PowerLaw(a=-1.3, b=0.5, c=0.05)
# The two cells of tab:altflip that the raw table does not give, with the values it gives (percent)
UNREPRODUCED = {(False, True, 20): 24.628, (True, True, 10): 1.282}
CELLS = [(cutout, tta, index) for (cutout, tta) in PAPER.PAPER_SPEEDUPS for index in range(4)]


def synthetic_runs(runs, noise, seed, law=LAW, epochs=EPOCHS):
    """{epochs: per-run accuracies}: the law's accuracy 1 - error plus Gaussian noise between runs
    (noise 0.0015 is about airbench94's 0.15% standard deviation)."""
    rng = np.random.default_rng(seed)
    return {e: 1 - float(law.error_at(e)) + rng.normal(0, noise, runs) for e in epochs}


# The paper's effective speedups (tab:altflip, airbench94 rows) from its raw table

@pytest.mark.parametrize('cutout,tta,index', CELLS)
def test_paper_speedup_cell(cutout, tta, index):
    """Random flip's 4-point fit inverted at alternating flip's error. Tolerance per cell: half a
    unit of the paper's last printed digit plus the first-order worst case of the raw table's
    rounding to 4 decimals (PAPER.rounding_bound; 0.009 to 1.3 points, the largest for the 80-epoch
    extrapolations). The two cells the raw table does not give are pinned to what it gives."""
    epochs = EPOCHS[index]
    baseline = PAPER.accuracies(cutout, tta, PAPER.RANDOM)
    ours = 100 * effective_speedup(EPOCHS, baseline, epochs,
                                   PAPER.accuracies(cutout, tta, PAPER.ALTERNATING)[index])
    printed = PAPER.PAPER_SPEEDUPS[(cutout, tta)][index]
    tolerance = PAPER.half_unit(printed) + PAPER.rounding_bound(cutout, tta, index)
    if (cutout, tta, epochs) in UNREPRODUCED:
        assert ours == pytest.approx(UNREPRODUCED[(cutout, tta, epochs)], abs=0.001)
        assert abs(ours - float(printed)) > tolerance
    else:
        assert abs(ours - float(printed)) <= tolerance


def test_paper_worked_example():
    """Random flip without TTA: 6.26% error at 20 epochs, 5.99% at 40; alternating 6.13% at 20.
    The 4-point fit gives 25.42 epochs and the table's 27.1%; the text's 25.3 epochs is what a fit
    to the 20/40/80-epoch points gives (25.29, i.e. 26.4%)."""
    baseline = PAPER.accuracies(False, False, PAPER.RANDOM)
    assert [round(100 * (1 - a), 2) for a in baseline[1:3]] == [6.26, 5.99]
    example = PAPER.worked_example()
    assert example['four_point_epochs'] == pytest.approx(25.421, abs=0.001)
    assert 100 * example['four_point_speedup'] == pytest.approx(27.1, abs=0.05)
    assert round(example['last_three_epochs'], 1) == 25.3


def test_paper_misprint_reproduces_the_tta_20_epoch_cell():
    """21.3% (no Cutout, TTA, 20 epochs) is what the alternating accuracy 94.6430 gives."""
    baseline = PAPER.accuracies(False, True, PAPER.RANDOM)
    assert 100 * effective_speedup(EPOCHS, baseline, 20, 0.946430) == pytest.approx(21.3, abs=0.005)


def test_recompute_table_matches_14_of_16_cells():
    rows = PAPER.recompute()
    assert len(rows) == 16
    assert {(r['cutout'], r['tta'], r['epochs']) for r in rows if not r['matched']} \
        == set(UNREPRODUCED)
    assert all(r['equivalent_epochs'] > r['epochs'] for r in rows)


def test_fit_does_not_depend_on_error_units():
    """Unweighted least squares: percent errors scale b and c by 100, a and the epochs stay."""
    errors = [1 - a for a in PAPER.accuracies(True, False, PAPER.RANDOM)]
    fraction = fit_power_law(EPOCHS, errors)
    percent = fit_power_law(EPOCHS, [100 * e for e in errors])
    assert percent.a == pytest.approx(fraction.a, rel=1e-7)
    assert (percent.b, percent.c) == pytest.approx((100 * fraction.b, 100 * fraction.c), rel=1e-6)
    assert percent.epochs_for_error(6.0) == pytest.approx(fraction.epochs_for_error(0.06), rel=1e-7)


# Fits, epochs to a target, effective speedup

def test_fit_recovers_a_known_law_and_inverts_it_exactly():
    law = fit_power_law(EPOCHS, LAW.error_at(EPOCHS))
    assert (law.a, law.b, law.c) == pytest.approx((LAW.a, LAW.b, LAW.c), rel=1e-8)
    target = 0.94  # error 0.06 = 0.05 + 0.5 * epochs**-1.3
    expected = (0.01 / 0.5) ** (1 / -1.3)
    accuracies = [1 - e for e in LAW.error_at(EPOCHS)]
    assert epochs_to_accuracy(EPOCHS, accuracies, target) == pytest.approx(expected, rel=1e-8)


def test_three_points_are_interpolated():
    errors = [0.07, 0.061, 0.058]
    law = fit_power_law([10, 20, 40], errors)
    assert law.error_at([10, 20, 40]) == pytest.approx(errors, abs=1e-12)
    assert law.at_bounds == ()


# airbench94 with random and alternating flip at 0.5, 1 and 2 epochs on a CPU (docs/results.md,
# "A demonstration"): TTA accuracies of runs 0 and 1. Its errors fall faster and faster.
SHORT_RANDOM = {0.5: [0.5475, 0.5418], 1: [0.6751, 0.6798], 2: [0.8147, 0.8099]}
SHORT_ALTERNATING = {0.5: [0.5433, 0.5376], 1: [0.6848, 0.6791], 2: [0.8106, 0.8102]}


def test_errors_falling_ever_faster_fit_no_law_and_the_fit_says_so():
    """No c + b * epochs**a with c >= 0 bends that way: the fit stops at c = 0 and misses the
    points by more than a point, where three points are otherwise interpolated; the paper's
    curves fit freely."""
    epochs = sorted(SHORT_RANDOM)
    errors = [1 - np.mean(SHORT_RANDOM[e]) for e in epochs]
    law = fit_power_law(epochs, errors)
    assert law.at_bounds == ('c',) and law.c == pytest.approx(0, abs=1e-12)
    assert np.abs(law.error_at(epochs) - errors).max() > 0.015
    for cutout, tta in PAPER.PAPER_SPEEDUPS:
        accuracies = np.array(PAPER.accuracies(cutout, tta, PAPER.RANDOM))  # fractions
        assert fit_power_law(EPOCHS, 1 - accuracies).at_bounds == ()


def speedup_of(curves):
    """analysis.speedup_analysis of {base: {epochs: per-run accuracies}} as a study would hold it."""
    configs, rows = {}, []
    for base, curve in curves.items():
        for epochs, accuracies in curve.items():
            name = f'{base},train_epochs={epochs:g}'
            configs[name] = Config(name=name, script='airbench94', base=base,
                                   grid={'opt.train_epochs': f'{epochs:g}'},
                                   hyp={'opt': {'train_epochs': epochs}})
            rows += [dict(config=name, run=run, accuracy=a) for run, a in enumerate(accuracies)]
    return analysis.speedup_analysis(pd.DataFrame(rows), configs, target=None)


def test_report_says_when_speedups_rest_on_a_misfit():
    """The summary carries each curve's fitted accuracies and bounds; the report marks every
    number derived from a curve whose fit stopped at a bound, and only those."""
    found = speedup_of({'random': SHORT_RANDOM, 'alternating': SHORT_ALTERNATING})
    random = found['curves']['random']
    assert random['fit']['at_bounds'] == ['c']
    assert random['fitted_accuracy'] == pytest.approx(
        [1 - fit_power_law([0.5, 1, 2], [1 - np.mean(SHORT_RANDOM[e]) for e in (0.5, 1, 2)])
         .error_at(e) for e in (0.5, 1, 2)])
    speedups = found['curves']['alternating']['speedup'].values()
    assert all(not s['reliable'] and 'stopped at the bound of c' in s['reason']
               for s in speedups if s['estimate'] is not None)
    notes = [line for line in markdown.speedup_lines(found) if line.startswith(markdown.DAGGER)]
    assert notes and all('stopped at the bound of c' in line for line in notes)
    free = speedup_of({'b': {e: [1 - float(LAW.error_at(e)) + d for d in (-0.001, 0, 0.001)]
                             for e in EPOCHS}})
    assert free['curves']['b']['fit']['at_bounds'] == []
    assert not [line for line in markdown.speedup_lines(free) if 'stopped at the bound' in line]


def test_per_run_accuracies_are_averaged():
    runs = synthetic_runs(runs=5, noise=0.002, seed=1)
    per_run = epochs_to_accuracy(EPOCHS, [runs[e] for e in EPOCHS], 0.94)
    means = epochs_to_accuracy(EPOCHS, [runs[e].mean() for e in EPOCHS], 0.94)
    assert per_run == means


def test_unreachable_target_is_infinite():
    accuracies = [1 - e for e in LAW.error_at(EPOCHS)]
    assert epochs_to_accuracy(EPOCHS, accuracies, 0.951) == math.inf  # error 0.049 < c = 0.05
    assert effective_speedup(EPOCHS, accuracies, 20, 0.951) == math.inf
    assert LAW.epochs_for_error(LAW.c) == math.inf


def test_speedup_is_negative_for_a_worse_configuration():
    accuracies = [1 - e for e in LAW.error_at(EPOCHS)]
    worse = 1 - float(LAW.error_at(10))  # the baseline's 10-epoch accuracy, reached at 20
    assert effective_speedup(EPOCHS, accuracies, 20, worse) == pytest.approx(-0.5, rel=1e-8)


@pytest.mark.parametrize('epochs', [[10, 20], [10, 10, 20, 20]])
def test_too_few_epoch_counts_is_an_error(epochs):
    with pytest.raises(ValueError, match='at least 3 distinct epoch counts, got 2'):
        fit_power_law(epochs, [0.07, 0.06, 0.065, 0.058][:len(epochs)])


def test_percentages_are_refused():
    with pytest.raises(ValueError, match='fractions'):
        epochs_to_accuracy(EPOCHS, [93.1, 93.7, 94.0, 94.1], 0.94)
    with pytest.raises(ValueError, match='fractions'):
        epochs_to_accuracy(EPOCHS, [0.931, 0.937, 0.940, 0.941], 94)


def test_errors_that_do_not_fall_cannot_be_fit():
    with pytest.raises(ValueError, match='do not fall with epochs'):
        fit_power_law(EPOCHS, [0.05, 0.06, 0.07, 0.08])


# Intervals

def test_interval_contains_the_estimate_and_shrinks_with_more_runs():
    """16 times the runs: the interval narrows by about 4 (1/sqrt(n)); asserted: by more than 2."""
    widths = []
    for runs in (25, 400):
        interval = epochs_to_accuracy_interval(synthetic_runs(runs, 0.0015, seed=runs), 0.94)
        assert interval['ci_low'] <= interval['estimate'] <= interval['ci_high']
        assert (interval['failed_draws'], interval['unreachable_draws']) == (0, 0)
        assert interval['reliable'] and interval['extrapolated'] is False
        widths.append(interval['ci_high'] - interval['ci_low'])
    assert widths[1] < widths[0] / 2


def test_effective_speedup_interval():
    """A configuration whose 20-epoch accuracy is the baseline's at 25 epochs: speedup 25%."""
    baseline = synthetic_runs(400, 0.0015, seed=2)
    compared = 1 - float(LAW.error_at(25)) + np.random.default_rng(3).normal(0, 0.0015, 400)
    interval = effective_speedup_interval(baseline, compared, 20)
    assert interval['ci_low'] < 0.25 < interval['ci_high']
    assert interval['estimate'] == pytest.approx(effective_speedup(
        EPOCHS, [baseline[e] for e in EPOCHS], 20, compared))
    assert interval['equivalent_epochs'] == pytest.approx(20 * (1 + interval['estimate']))


def test_interval_counts_unreachable_draws_and_opens_its_upper_bound():
    """A target 0.0005 above the asymptote: many draws put the asymptote above it, so the
    interval is [low, open): it still covers, and says so in ci_high = None."""
    interval = epochs_to_accuracy_interval(synthetic_runs(100, 0.0015, seed=4), 1 - 0.0505)
    assert interval['unreachable_draws'] > 0.025 * interval['draws']
    assert interval['ci_high'] is None and interval['ci_low'] is not None
    assert interval['failed_draws'] == 0


def test_interval_counts_draws_that_fit_no_law():
    """A curve that barely falls (0.02 points over 4 epoch counts, noise 0.15 points): most draws
    fit no falling law; they are counted and the interval is not reliable."""
    runs = {e: 0.94 + 0.0002 * i + np.random.default_rng(i).normal(0, 0.0015, 5)
            for i, e in enumerate(EPOCHS)}
    interval = epochs_to_accuracy_interval(runs, 0.9401)
    assert interval['failed_draws'] > 0.025 * interval['draws'] or interval['estimate'] is None
    assert not interval['reliable']


# Test-set and distribution-wise standard deviation

def test_test_set_std_is_the_sample_std():
    accuracies = [0.9401, 0.9385, 0.9412, 0.9397]
    expected = statistics.stdev(accuracies)
    assert variance.test_set_std(accuracies) == pytest.approx(expected, rel=1e-12)


def test_distribution_wise_variance_is_the_mean_covariance_between_examples():
    """Jordan (2024) Eq. 3 equals 1/(n(n-1)) * sum over i != j of the examples' covariances over
    runs (sample covariances, ddof=1)."""
    correct = np.random.default_rng(5).random((9, 6)) < 0.7
    covariance = np.cov(correct.T.astype(float))
    mean_off_diagonal = (covariance.sum() - np.trace(covariance)) / (6 * 5)
    assert distribution_wise_variance(correct) == pytest.approx(mean_off_diagonal, rel=1e-12)


def test_independent_errors_have_no_distribution_wise_variance():
    """Each example correct with its own fixed rate, independently across runs and examples: the
    true distribution-wise variance is 0. The estimate's standard error is about
    Var(test accuracy) * sqrt(2 / (R - 1)) (that of a sample variance of R runs): allow 4 of them,
    while the test-set variance itself is 14 standard errors away from 0."""
    rng = np.random.default_rng(6)
    runs, examples = 400, 2000
    correct = rng.random((runs, examples)) < rng.uniform(0.5, 1.0, examples)
    test_variance = variance.test_set_std(correct.mean(axis=1)) ** 2
    assert abs(distribution_wise_variance(correct)) < 4 * test_variance * math.sqrt(2 / (runs - 1))


def test_shared_shift_between_runs_is_recovered():
    """Run r is correct on example i with probability p_i + d_r, d_r ~ N(0, s^2) shared by all
    examples: the distribution-wise variance is the variance of d (here compared with its sample
    variance over the runs drawn). Given d, the estimate's error comes from the Bernoulli noise e
    (Var(e_r) = v = mean p(1-p) / n): about v * sqrt(2 / R) from its sample variance plus
    2 * sqrt(Var(d) * v / R) from its covariance with d; allow 4 of that. Here v = Var(d), so the
    test-set variance is about twice the shift's."""
    rng = np.random.default_rng(7)
    runs, examples = 10000, 1000
    rates = rng.uniform(0.6, 0.9, examples)
    shifts = rng.normal(0, math.sqrt(np.mean(rates * (1 - rates)) / examples), runs)
    correct = rng.random((runs, examples)) < rates + shifts[:, None]
    shift_variance = shifts.var(ddof=1)
    noise_variance = np.mean(rates * (1 - rates)) / examples
    standard_error = (noise_variance * math.sqrt(2 / runs)
                      + 2 * math.sqrt(shift_variance * noise_variance / runs))
    estimate = distribution_wise_variance(correct)
    assert abs(estimate - shift_variance) < 4 * standard_error
    assert variance.test_set_std(correct.mean(axis=1)) ** 2 > 1.5 * shift_variance
    assert distribution_wise_std(correct) == pytest.approx(math.sqrt(estimate))


def test_negative_estimate_gives_zero_std():
    """Two examples, each run right on exactly one: every run scores 0.5, test-set variance 0;
    each example's variance over 4 runs (ddof=1) is 4/3 * 0.5 * 0.5 = 1/3, so
    var = 2/1 * (0 - (1/3 + 1/3) / 2^2) = -1/3."""
    correct = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])
    assert distribution_wise_variance(correct) == pytest.approx(-1 / 3)
    assert distribution_wise_std(correct) == 0.0


def test_variance_accepts_torch_and_refuses_bad_input():
    correct = torch.rand(50, 30, generator=torch.Generator().manual_seed(8)) < 0.8
    assert distribution_wise_std(correct) == distribution_wise_std(correct.numpy())
    with pytest.raises(ValueError, match='runs x test examples'):
        distribution_wise_variance(np.ones(10))
    with pytest.raises(ValueError, match='0/1'):
        distribution_wise_variance(np.full((3, 3), 0.5))


# Class-aggregated calibration error

def test_cace_of_a_calibrated_ensemble_is_zero():
    """4 runs, 2 classes, 4 examples each predicted class 0 by 3 runs (confidence 0.75 for class 0,
    0.25 for class 1), labels 0, 0, 0, 1: 3/4 of the class-0 pairs and 1/4 of the class-1 pairs
    are right, exactly as confident as the ensemble."""
    predictions = np.array([[0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]])
    labels = np.array([0, 0, 0, 1])
    assert class_aggregated_calibration_error(predictions, labels, bins=None) == 0.0
    assert class_aggregated_calibration_error(predictions, labels, bins=2) == 0.0


def test_cace_hand_computed():
    """3 examples, 3 classes, 4 runs. Votes per example (classes 0, 1, 2): (3, 1, 0), (0, 3, 1),
    (3, 0, 1); labels 0, 2, 0. Pairs (example, class) by confidence level q:
      q = 0:    (0,2) (1,0) (2,1), none labelled:            |0 - 0 * 3|    = 0
      q = 0.25: (0,1) (1,2) (2,2), one labelled, (1,2):      |1 - 0.25 * 3| = 0.25
      q = 0.75: (0,0) (1,1) (2,0), two labelled:             |2 - 0.75 * 3| = 0.25
    CACE = (0 + 0.25 + 0.25) / 3 examples = 1/6: at q = 0.75 two thirds are right, 1/12 less than
    claimed, at q = 0.25 one third, 1/12 more, each level weighing 3 pairs / 3 examples = 1.
    One bin pools every pair: 3 labels against confidences summing to 3, so CACE = 0."""
    predictions = np.array([[0, 1, 2], [0, 1, 0], [0, 2, 0], [1, 1, 0]])
    labels = np.array([0, 2, 0])
    assert class_aggregated_calibration_error(predictions, labels, bins=None) == \
        pytest.approx(1 / 6)
    assert class_aggregated_calibration_error(predictions, labels, bins=None, num_classes=10) \
        == pytest.approx(1 / 6)
    assert class_aggregated_calibration_error(predictions, labels, bins=1) == pytest.approx(0)


def test_cace_of_a_sampled_calibrated_ensemble_is_within_its_noise():
    """Labels drawn from the ensemble's own class probabilities (each example's label is a random
    run's prediction) make it calibrated in expectation. Each level v's term
    sum (1[y_i = k] - q) has variance at most M_v q_v (1 - q_v) (M_v pairs at confidence q_v):
    allow 4 standard deviations per level. Labelling every example with its majority class
    instead (an under-confident ensemble) is far outside that."""
    rng = np.random.default_rng(9)
    runs, examples, classes = 8, 5000, 10
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


def test_curves_whose_runs_share_seeds_are_paired():
    """Run i of every epoch count and configuration shares its seeds (study.py's design): the
    curve's intervals are paired, the same as fits' own with paired=True; rows without seeds (or
    with other seeds) are not."""
    runs = synthetic_runs(4, 0.0015, seed=11)
    faster = {e: 1 - float(LAW.error_at(1.25 * e)) + np.random.default_rng(12).normal(0, 0.0015, 4)
              for e in EPOCHS}
    configs, rows = {}, []
    for base, curve in (('base', runs), ('fast', faster)):
        for epochs, accuracies in curve.items():
            name = f'{base},train_epochs={epochs:g}'
            configs[name] = Config(name=name, script='airbench94', base=base,
                                   grid={'opt.train_epochs': f'{epochs:g}'},
                                   hyp={'opt': {'train_epochs': epochs}})
            rows += [dict(config=name, run=run, accuracy=a, seed_init=run, seed_order=run,
                          seed_aug=run) for run, a in enumerate(accuracies)]
    found = analysis.speedup_analysis(pd.DataFrame(rows), configs, target=0.94)
    curve = found['curves']['fast']
    assert curve['design'] == 'paired' and curve['epochs_to_target']['paired']
    assert curve['epochs_to_target']['ci_low'] == pytest.approx(epochs_to_accuracy_interval(
        faster, 0.94, paired=True)['ci_low'])
    assert curve['speedup']['20.0']['ci_high'] == pytest.approx(effective_speedup_interval(
        runs, faster[20], 20, paired=True)['ci_high'])
    unseeded = speedup_of({'base': runs, 'fast': faster})
    assert unseeded['curves']['fast']['design'] == 'unpaired'


def test_report_flags_a_curve_that_no_power_law_fits():
    """Errors 0.055 + 0.25 exp(-epochs / 6), 5 runs per cell: the curve's lack-of-fit test
    rejects the law, the report shows "bad fit" with its reason, and the speedups derived from it
    are marked."""
    rng = np.random.default_rng(13)
    curve = {e: 1 - (0.055 + 0.25 * math.exp(-e / 6)) + rng.normal(0, 0.0015, 5)
             for e in (5, 10, 20, 40)}
    other = {e: values + 0.002 for e, values in curve.items()}
    found = speedup_of({'exponential': curve, 'other': other})
    assert found['curves']['exponential']['lack_of_fit']['p_value'] < 0.05
    lines = markdown.speedup_lines(found)
    assert any('bad fit' in line for line in lines)
    assert any(line.startswith(markdown.DAGGER) and 'does not fit' in line for line in lines)
    assert all(not s['reliable'] for s in found['curves']['other']['speedup'].values())
