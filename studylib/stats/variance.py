"""Variance between runs and calibration of the ensemble of runs (airbench paper, section
"Variance and class-wise calibration", table tab:variance), with their intervals.

Inputs are numpy arrays (a torch tensor: np.asarray after .cpu()): per-run accuracies as
fractions; `correct`, runs x test examples, 1 where the run was right; `predictions`, runs x test
examples, class ids. EnsembleTally takes the runs one at a time instead, so that 10,000 runs of
10,000 test images fit in the memory of one run's predictions and the ensemble's vote counts.
"""
import math

import numpy as np
from scipy import stats

VOTE_CHUNK_RUNS = 256  # runs counted at once by ensemble_votes (bounds its memory)
CALIBRATION_BINS = 15  # equal-mass bins of the calibration error (Nixon et al. 2019's default)
RESAMPLES = 1000  # bootstrap resamples of test examples for the calibration error's interval
CALIBRATED_DRAWS = 200  # label sets drawn from an exactly calibrated ensemble (its level)
BINNING_RUNS = 50  # the calibration error's bins are those of this many runs' vote shares


def test_set_std(accuracies):
    """Standard deviation between runs of test-set accuracy (fractions; ddof=1, 2 or more runs)."""
    accuracies = np.asarray(accuracies, dtype=float).ravel()
    if accuracies.size < 2:
        raise ValueError(f'a standard deviation between runs needs at least 2 runs, got '
                         f'{accuracies.size}')
    return float(np.std(accuracies, ddof=1))


def distribution_wise_variance(correct):
    """Unbiased estimate of the variance between runs of accuracy on the test distribution.

    Jordan (2024), "Calibrated Chaos: Variance Between Runs of Neural Network Training is
    Harmless and Inevitable" (ICLR 2024), Theorem 2 (Eq. 3):

        var_dist = n / (n - 1) * (Var_h(A) - (1 / n^2) * sum_i Var_h(C_i))

    with n test examples, C_i a run's 0/1 correctness on example i, A = mean_i C_i its test-set
    accuracy, and Var_h sample variances over the R runs with ddof=1, so that the estimate is
    unbiased over runs too (with ddof=0 it is (R - 1) / R times this one). It equals the mean
    covariance over runs between distinct examples, whose expectation over test sets drawn from
    the distribution is the distribution-wise variance (the paper's Lemma 1). Units: fractions
    squared. Negative when the runs' accuracies vary less than independent errors would make them
    (sampling noise when the true value is near 0).
    """
    correct = _correctness(correct)
    return float(_distribution_wise_variance(correct.mean(axis=1), correct.sum(axis=0)))


def _distribution_wise_variance(accuracies, correct_counts):
    """Theorem 2's estimate from each run's accuracy and each example's count of runs correct:
    (the test-set variance, the sampling term n/(n-1) * (1/n^2) sum_i Var_h(C_i))."""
    runs = len(accuracies)
    examples = len(correct_counts)
    rates = np.asarray(correct_counts, dtype=float) / runs
    sampling = (rates * (1 - rates)).sum() * runs / (runs - 1) / examples ** 2
    return examples / (examples - 1) * (np.var(accuracies, ddof=1) - sampling)


def distribution_wise_std(correct):
    """sqrt(max(distribution_wise_variance(correct), 0)), a fraction: 0.0 where the unbiased
    estimate is negative (distribution_wise_variance gives the negative value)."""
    return math.sqrt(max(distribution_wise_variance(correct), 0.0))


def _correctness(correct):
    correct = np.asarray(correct)
    if correct.ndim != 2 or correct.shape[0] < 2 or correct.shape[1] < 2:
        raise ValueError(f'correct must be runs x test examples with at least 2 of each, got '
                         f'shape {correct.shape}')
    if correct.dtype != bool:
        if not np.isin(correct, (0, 1)).all():
            raise ValueError('correct must hold 0/1 or booleans')
        correct = correct.astype(bool)
    return correct


def ensemble_votes(predictions, num_classes):
    """votes[i, k]: the number of runs predicting class k on example i (examples x classes), from
    predictions (runs x examples, class ids)."""
    runs, examples = predictions.shape
    offsets = np.arange(examples) * num_classes
    votes = np.zeros(examples * num_classes, dtype=np.int64)
    for start in range(0, runs, VOTE_CHUNK_RUNS):
        chunk = predictions[start:start + VOTE_CHUNK_RUNS] + offsets
        votes += np.bincount(chunk.ravel(), minlength=examples * num_classes)
    return votes.reshape(examples, num_classes)


def class_aggregated_calibration_error(predictions, labels, bins=CALIBRATION_BINS,
                                       num_classes=None):
    """Class-aggregated calibration error (CACE) of the ensemble of these runs, as defined: the
    plug-in estimate, which depends on the number of runs (calibration_error's does not).

    Jiang, Nagarajan, Baek and Kolter, "Assessing Generalization of SGD via Disagreement" (ICLR
    2022), Definition 4.4, for the ensemble h~ whose probability of class k on x is the fraction
    of runs predicting k (hard predictions):

        CACE = integral over q of |sum_k P(Y = k, h~_k(X) = q) / sum_k P(h~_k(X) = q) - q|
                                  * sum_k P(h~_k(X) = q) dq.

    Classes are pooled within each confidence level q and the weights are not divided by K, so
    CACE lies in [0, K]. With vote counts v_ik of R runs on N examples, h~_k(x_i) = v_ik / R;
    bins=B (default 15) groups consecutive vote levels into bins of nearly equal mass of (example,
    class) pairs (equal_mass_bins), each bin's label count against its summed confidences:

        CACE = (1 / N) * sum_b | sum_{(i, k) in b} (1[y_i = k] - v_ik / R) |.

    bins=None makes every level its own bin. With bins the estimate falls as runs are added to an
    ensemble calibrated in the limit, as pairs binned high because their votes came out high
    regress to the mean (docs/studies.md gives the figures); every level its own bin grows instead.

    predictions: runs x examples class ids; labels: the examples' class ids; num_classes defaults
    to 1 + the largest id seen (with bins=None the result does not depend on it).
    """
    predictions, labels, num_classes = _checked_predictions(predictions, labels, num_classes)
    votes = ensemble_votes(predictions, num_classes)
    runs = predictions.shape[0]
    binning = equal_mass_bins(level_counts(votes, runs), bins)
    return float(np.abs(deviations(votes, votes / runs, labels, binning).sum(axis=0)).sum()
                 / labels.size)


def _checked_predictions(predictions, labels, num_classes):
    predictions = np.asarray(predictions)
    labels = np.asarray(labels).ravel()
    if predictions.ndim != 2 or predictions.shape[1] != labels.size:
        raise ValueError(f'predictions must be runs x examples for {labels.size} labels, got '
                         f'shape {predictions.shape}')
    if not (np.issubdtype(predictions.dtype, np.integer) and np.issubdtype(labels.dtype,
                                                                           np.integer)):
        raise ValueError('predictions and labels must be integer class ids')
    if predictions.min() < 0 or labels.min() < 0:
        raise ValueError('class ids must be non-negative')
    num_classes = num_classes or int(max(predictions.max(), labels.max())) + 1
    if max(predictions.max(), labels.max()) >= num_classes:
        raise ValueError(f'class ids must be below num_classes={num_classes}')
    return predictions, labels, num_classes


def level_counts(votes, runs):
    """The number of (example, class) pairs at each vote level 0..runs."""
    return np.bincount(votes.ravel(), minlength=runs + 1)


def equal_mass_bins(pairs_per_level, bins):
    """The bin of each vote level 0..runs: every level its own (bins=None), or up to `bins` bins of
    consecutive levels, never splitting one. A bin closes once it holds its share of the pairs not
    yet binned over the bins left, so that a level heavier than its share (the zero-vote level can
    hold most pairs of 10 classes) is a bin alone and the lighter levels share all the others."""
    if bins is None:
        return np.arange(pairs_per_level.size)
    if not bins >= 1:
        raise ValueError(f'bins must be a positive number of bins or None, got {bins}')
    bin_of_level = np.zeros(pairs_per_level.size, dtype=np.int64)
    left = pairs_per_level.sum()
    bins_left = bins
    current = 0
    held = 0
    share = left / bins_left
    for level in np.flatnonzero(pairs_per_level):
        bin_of_level[level] = current
        held += pairs_per_level[level]
        if held >= share and bins_left > 1:
            left -= held  # before held is emptied: the next bin's share is of what is left
            bins_left -= 1
            current += 1
            held = 0
            share = left / bins_left
    return bin_of_level


def bins_used(pairs_per_level, bin_of_level, runs):
    """Each bin as used: its confidence range [lowest, highest level / runs], its share of pairs."""
    levels = np.flatnonzero(pairs_per_level)
    found = []
    for index in np.unique(bin_of_level[levels]):
        mine = levels[bin_of_level[levels] == index]
        found.append(dict(low=float(mine[0] / runs), high=float(mine[-1] / runs),
                          share=float(pairs_per_level[mine].sum() / pairs_per_level.sum())))
    return found


def deviations(levels, confidences, labels, bin_of_level):
    """examples x bins: each example's sum over its classes in the bin of 1[label = k] less the
    confidence of k, the pairs binned by their vote level (levels: examples x classes). The
    calibration error is (1 / N) sum_b |sum_i of this|; a bootstrap reweights its rows."""
    examples, classes = levels.shape
    count = int(bin_of_level.max()) + 1
    bin_index = bin_of_level[levels] + count * np.arange(examples)[:, None]
    truth = np.zeros((examples, classes))
    truth[np.arange(examples), labels] = 1
    return np.bincount(bin_index.ravel(), weights=(truth - confidences).ravel(),
                       minlength=examples * count).reshape(examples, count)


def calibration_error(predictions, labels, confidence=0.95, bins=CALIBRATION_BINS, seed=0):
    """EnsembleTally.calibration_error of these runs (predictions: runs x examples class ids;
    labels: the examples' class ids): the split-half estimate with its interval and bins, the
    plug-in estimate and the level of an exactly calibrated ensemble."""
    predictions, labels, num_classes = _checked_predictions(predictions, labels, None)
    tally = EnsembleTally(labels, num_classes)
    for run in predictions:
        tally.add(run)
    return tally.calibration_error(confidence, bins, seed)


def sample_variance_interval(values, confidence):
    """The chi-square interval of the variance, (low, high): exact for normally spread values
    (n - 1 degrees of freedom), and only for them. A heavier tail makes the variance of the
    sample variance larger than the interval assumes: with one run in 20 lower by a further 0.5
    points it covered 92% at n = 3 and 85% at n = 25 (simulated: docs/studies.md)."""
    n = len(values)
    variance = float(np.var(values, ddof=1))
    tail = (1 - confidence) / 2
    return ((n - 1) * variance / stats.chi2.ppf(1 - tail, n - 1),
            (n - 1) * variance / stats.chi2.ppf(tail, n - 1))


class EnsembleTally:
    """What the variance and calibration analyses need of runs taken one at a time, in memory that
    grows by one number per run: each run's accuracy and votes (2 x examples x classes: the runs
    added at even and at odd positions apart, for the split-half calibration estimate)."""

    def __init__(self, labels, num_classes):
        self.labels = np.asarray(labels).ravel().astype(np.int64)
        self.votes = np.zeros((2, self.labels.size, num_classes), dtype=np.int64)
        self.accuracies = []

    @property
    def runs(self):
        return len(self.accuracies)

    def add(self, predictions):
        """One run's predicted class per example."""
        predictions = np.asarray(predictions).ravel()
        if predictions.shape != self.labels.shape or not np.issubdtype(predictions.dtype,
                                                                        np.integer):
            raise ValueError(f'a run predicts one class id per example ({self.labels.size}), got '
                             f'{predictions.dtype} of shape {predictions.shape}')
        self.votes[self.runs % 2, np.arange(self.labels.size), predictions] += 1
        self.accuracies.append(float((predictions == self.labels).mean()))

    def ensemble_votes(self):
        """examples x classes: every run's votes."""
        return self.votes.sum(axis=0)

    def correct_counts(self):
        return self.ensemble_votes()[np.arange(self.labels.size), self.labels]

    def summary(self, confidence=0.95, seed=0):
        """The variance table's entry: n, mean accuracy, test-set std, distribution-wise variance
        and std, each std with its chi-square interval (test_set_std_ci_assumes says what it
        assumes), and the calibration error. A distribution-wise variance estimated below 0 has
        no std (None, with distribution_wise_note), only the interval [0, high]."""
        if self.runs < 2:
            raise ValueError(f'variance between runs needs at least 2 runs, got {self.runs}')
        accuracies = np.array(self.accuracies)
        examples = self.labels.size
        low, high = sample_variance_interval(accuracies, confidence)
        estimate = float(_distribution_wise_variance(accuracies, self.correct_counts()))
        sampling = float(np.var(accuracies, ddof=1)) * examples / (examples - 1) - estimate
        dist_low, dist_high = (examples / (examples - 1) * bound - sampling
                               for bound in (low, high))
        return dict(
            n=self.runs, mean=float(accuracies.mean()),
            test_set_std=float(accuracies.std(ddof=1)),
            test_set_std_ci=[math.sqrt(low), math.sqrt(high)],
            test_set_std_ci_assumes='runs spread normally (chi-square interval)',
            distribution_wise_variance=estimate,
            distribution_wise_std=math.sqrt(estimate) if estimate >= 0 else None,
            distribution_wise_std_ci=[math.sqrt(max(dist_low, 0)), math.sqrt(max(dist_high, 0))],
            distribution_wise_note=None if estimate >= 0 else
            'estimated below 0: not distinguished from 0 (the interval is its upper bound)',
            calibration=self.calibration_error(confidence, seed=seed))

    def calibration_error(self, confidence=0.95, bins=CALIBRATION_BINS, seed=0):
        """The class-aggregated calibration error of the ensemble in the limit of many runs, the
        same figure at any number of runs from 2 * BINNING_RUNS (100) on: the split-half estimate
        on the runs at even and at odd positions. Returns its entry with plug_in (falls as runs
        are added), calibrated_level and calibrated_upper (the mean and the (1 + confidence) / 2
        quantile of the estimate for CALIBRATED_DRAWS label sets drawn from the scoring half's own
        vote shares: a test set this size's floor; above calibrated_upper is miscalibration), runs
        and examples; with one run, reason in place of the estimate."""
        if self.runs < 1:
            raise ValueError('a calibration error needs at least 1 run')
        votes = self.ensemble_votes()
        examples = self.labels.size
        plug_in = float(np.abs(deviations(votes, votes / self.runs, self.labels, equal_mass_bins(
            level_counts(votes, self.runs), bins)).sum(axis=0)).sum() / examples)
        if self.runs < 2:
            return dict(estimate=None, ci_low=None, ci_high=None, plug_in=plug_in,
                        runs=self.runs, examples=examples, calibrated_level=None,
                        calibrated_upper=None,
                        reason='one run: the split-half estimate needs 2 or more')
        rng = np.random.default_rng(seed)
        halves = [(self.votes[h], (self.runs + 1 - h) // 2) for h in (0, 1)]
        entry, binned = split_half_calibration_error(halves, self.labels, bins, confidence, rng)
        calibrated = [_split_estimate([deviations(
            binned[h][0], halves[1 - h][0] / halves[1 - h][1],
            _labels_from(halves[1 - h][0], rng), binned[h][2]) for h in (0, 1)], examples)
            for _ in range(CALIBRATED_DRAWS)]
        return dict(entry, plug_in=plug_in, runs=self.runs, examples=examples,
                    calibrated_level=float(np.mean(calibrated)),
                    calibrated_upper=float(np.quantile(calibrated, (1 + confidence) / 2)),
                    reason=None)


def split_half_calibration_error(halves, labels, bins=CALIBRATION_BINS, confidence=0.95,
                                 rng=None):
    """The split-half estimate of the class-aggregated calibration error, from the votes of two
    halves of the runs (halves: [(votes, runs), (votes, runs)], votes examples x classes).

    The plug-in estimate scores a pair against the same vote share it was binned by: a pair whose
    votes came out high by chance is binned high and scored against its high share, a bias that
    falls as runs are added. Here each pair is binned by one half's votes and scored against the
    other half's shares, whose noise is independent of the binning, so that each bin's sum has
    expectation 0 for an ensemble calibrated in the limit; the estimate is the mean of the two
    ways round (cross-fitting). The bins are those of BINNING_RUNS runs' vote shares (a larger
    half is thinned by thin_votes), as bins of more runs are narrower and pool less, which changes
    the figure: so its expectation is the same at any number of runs from 2 * BINNING_RUNS
    (simulated: docs/studies.md; tests/stats/test_variance.py holds it). It keeps the floor a
    finite test set gives (labels drawn by chance). The interval: the estimate +- z * its standard
    deviation over RESAMPLES bootstrap resamples of the test examples, the bins held (coverage of
    the estimator's mean: docs/studies.md).

    Returns (entry, binned): entry holds estimate, ci_low, ci_high, confidence, interval (its
    method), bins (the first half's: each one's confidence range and share of the pairs),
    bins_used (per half), binning_runs and comparable (False below 2 * BINNING_RUNS runs, with
    note); binned: per half (votes binned, their runs, the bin of each level)."""
    rng = np.random.default_rng(0) if rng is None else rng
    examples = labels.size
    binned = []
    for votes, runs in halves:
        thinned, kept = thin_votes(votes, runs, BINNING_RUNS, rng)
        binned.append((thinned, kept, equal_mass_bins(level_counts(thinned, kept), bins)))
    rows = [deviations(binned[h][0], halves[1 - h][0] / halves[1 - h][1], labels, binned[h][2])
            for h in (0, 1)]
    estimate = _split_estimate(rows, examples)
    spread = float(np.std(_bootstrap_split(rows, examples, rng), ddof=1))
    z = stats.norm.ppf((1 + confidence) / 2)
    fewest = min(runs for _, runs in halves)
    entry = dict(estimate=estimate, ci_low=float(max(estimate - z * spread, 0.0)),
                 ci_high=float(estimate + z * spread), confidence=confidence,
                 interval='estimate +- z * bootstrap standard deviation over test examples',
                 bins=bins_used(level_counts(*binned[0][:2]), binned[0][2], binned[0][1]),
                 bins_used=[len(bins_used(level_counts(v, r), b, r)) for v, r, b in binned],
                 binning_runs=min(fewest, BINNING_RUNS), comparable=fewest >= BINNING_RUNS,
                 note=None if fewest >= BINNING_RUNS else
                 f'{2 * fewest} runs or so, fewer than {2 * BINNING_RUNS}: the bins are those of '
                 f'{fewest} runs, not {BINNING_RUNS}, and the figure does not compare with '
                 'studies of more runs')
    return entry, binned


def thin_votes(votes, runs, keep, rng):
    """(votes, keep): the votes of `keep` of the runs drawn without replacement, example by example
    (multivariate hypergeometric, class by class); the votes as they are where runs <= keep."""
    if runs <= keep:
        return votes, runs
    thinned = np.zeros_like(votes)
    left = np.full(votes.shape[0], runs)
    wanted = np.full(votes.shape[0], keep)
    for k in range(votes.shape[1] - 1):
        thinned[:, k] = rng.hypergeometric(votes[:, k], left - votes[:, k], wanted)
        left = left - votes[:, k]
        wanted = wanted - thinned[:, k]
    thinned[:, -1] = wanted
    return thinned, keep


def _labels_from(votes, rng):
    """Labels drawn from the vote shares of `votes` (an exactly calibrated ensemble)."""
    shares = votes.cumsum(axis=1) / votes[0].sum()
    drawn = (shares <= rng.random((votes.shape[0], 1))).sum(axis=1)
    return np.minimum(drawn, votes.shape[1] - 1)


def _split_estimate(rows, examples):
    return float(np.mean([np.abs(row.sum(axis=0)).sum() for row in rows]) / examples)


def _bootstrap_split(rows, examples, rng, chunk=100):
    """The split-half estimate on RESAMPLES resamples of the test examples (the bins held)."""
    found = []
    for start in range(0, RESAMPLES, chunk):
        count = min(chunk, RESAMPLES - start)
        offsets = examples * np.arange(count)[:, None]  # one bincount for all the resamples
        chosen = rng.integers(0, examples, (count, examples)) + offsets
        weights = np.bincount(chosen.ravel(), minlength=count * examples).reshape(
            count, examples).astype(float)  # how often each example was drawn
        found.append(np.mean([np.abs(weights @ row).sum(axis=1) for row in rows], axis=0)
                     / examples)
    return np.concatenate(found)
