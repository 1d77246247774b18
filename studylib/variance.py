"""Variance between runs and calibration of the ensemble of runs (airbench paper, section
"Variance and class-wise calibration", table tab:variance), with their intervals.

Inputs are numpy arrays (torch tensors are converted with np.asarray after .cpu()): per-run
accuracies as fractions; `correct`, runs x test examples, 1 where the run classified the example
correctly; `predictions`, runs x test examples, each run's predicted class ids. EnsembleTally
takes the runs one at a time instead, so that 10,000 runs of 10,000 test images are analysed in
the memory of one run's predictions and the ensemble's vote counts.
"""
import math

import numpy as np
from scipy import stats

VOTE_CHUNK_RUNS = 256  # runs counted at once by ensemble_votes (bounds its memory)
CALIBRATION_BINS = 15  # equal-mass bins of the calibration error (Nixon et al. 2019's default)
RESAMPLES = 1000  # bootstrap resamples of test examples for the calibration error's interval
CALIBRATED_DRAWS = 200  # label sets drawn from an exactly calibrated ensemble (its level)


def test_set_std(accuracies):
    """Standard deviation between runs of test-set accuracy (fractions):
    sqrt(sum_r (A_r - mean(A))^2 / (R - 1)) over R >= 2 runs (ddof=1)."""
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
    accuracy, and Var_h variances over runs. It equals the mean covariance over runs between
    distinct examples, 1 / (n (n - 1)) * sum_{i != j} Cov_h(C_i, C_j), whose expectation over
    test sets drawn from the distribution is the distribution-wise variance (the paper's Lemma 1).
    The variances over runs are the sample variances over the R runs with ddof=1, so the estimate
    is unbiased over runs as well: Var_h(C_i) = R / (R - 1) * p_i (1 - p_i), p_i the fraction of
    runs correct on example i (with ddof=0 for both terms the whole estimate is (R - 1) / R times
    this one). Units: fractions squared. The estimate is negative when the runs' accuracies vary
    less than independent errors would make them (sampling noise when the true value is near 0).
    """
    correct = _correctness(correct)
    return float(_distribution_wise_variance(correct.mean(axis=1), correct.sum(axis=0)))


def _distribution_wise_variance(accuracies, correct_counts):
    """Theorem 2's estimate from each run's accuracy and each example's count of runs correct:
    (the test-set variance, the sampling term n/(n-1) * (1/n^2) sum_i Var_h(C_i))."""
    runs, examples = len(accuracies), len(correct_counts)
    rates = np.asarray(correct_counts, dtype=float) / runs
    sampling = (rates * (1 - rates)).sum() * runs / (runs - 1) / examples ** 2
    return examples / (examples - 1) * (np.var(accuracies, ddof=1) - sampling)


def distribution_wise_std(correct):
    """sqrt(max(distribution_wise_variance(correct), 0)), a fraction: 0.0 where the unbiased
    variance estimate is negative (call distribution_wise_variance to see the negative value;
    EnsembleTally.summary reports such an estimate as undistinguished from 0, with its interval)."""
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
    """Class-aggregated calibration error (CACE) of the ensemble of runs.

    Jiang, Nagarajan, Baek and Kolter, "Assessing Generalization of SGD via Disagreement" (ICLR
    2022), Definition 4.4, for the ensemble h~ whose probability of class k on x is the fraction
    of runs predicting k (hard predictions):

        CACE = integral over q of |sum_k P(Y = k, h~_k(X) = q) / sum_k P(h~_k(X) = q) - q|
                                  * sum_k P(h~_k(X) = q) dq.

    Classes are pooled within each confidence level q (not compared class by class) and the
    weights are not divided by K, so CACE lies in [0, K]. On N test examples and R runs,
    h~_k(x_i) = v_ik / R for vote counts v_ik. bins=B (default 15) groups consecutive vote
    levels into about B bins of equal mass of (example, class) pairs, level v going to bin
    floor(B * F(v)) with F(v) the fraction of pairs with fewer votes (a level is never split),
    and compares each bin's label count with its summed confidences:

        CACE = (1 / N) * sum_b | sum_{(i, k) in b} (1[y_i = k] - v_ik / R) |,

    i.e. the definition with q the bin's mean confidence. The bins do not multiply with the runs,
    so the estimate is consistent as runs grow; on a finite test set it keeps a floor, the level
    an exactly calibrated ensemble shows (calibration_error reports it). bins=None makes every
    level its own bin, exact for the empirical distribution but biased upward more and more as
    runs grow (R + 1 levels of fewer and fewer pairs, whose noise the absolute value keeps).

    predictions: runs x examples class ids; labels: the examples' class ids. num_classes
    defaults to 1 + the largest id seen (with bins=None the result does not depend on it).
    """
    predictions, labels, num_classes = _checked_predictions(predictions, labels, num_classes)
    votes = ensemble_votes(predictions, num_classes)
    return _calibration_error(votes, labels, predictions.shape[0], bins)


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


def _calibration_error(votes, labels, runs, bins):
    """CACE from the ensemble's vote counts (examples x classes) and the labels."""
    pairs_per_level = np.bincount(votes.ravel(), minlength=runs + 1)
    labelled_per_level = np.bincount(votes[np.arange(labels.size), labels], minlength=runs + 1)
    confidence_per_level = pairs_per_level * np.arange(runs + 1) / runs
    bin_of_level = _equal_mass_bins(pairs_per_level, bins)
    labelled = np.bincount(bin_of_level, weights=labelled_per_level)
    confidence = np.bincount(bin_of_level, weights=confidence_per_level)
    return float(np.abs(labelled - confidence).sum() / labels.size)


def _equal_mass_bins(pairs_per_level, bins):
    """Bin index of each vote level: the level itself (bins=None), or floor(bins * F(level)) with
    F the fraction of pairs at lower levels."""
    if bins is None:
        return np.arange(pairs_per_level.size)
    if bins < 1:
        raise ValueError(f'bins must be a positive number of bins or None, got {bins}')
    below = np.concatenate([[0], np.cumsum(pairs_per_level)[:-1]]) / pairs_per_level.sum()
    return np.minimum((below * bins).astype(np.int64), bins - 1)


def calibration_error(predictions, labels, confidence=0.95, bins=CALIBRATION_BINS, seed=0):
    """The class-aggregated calibration error of the ensemble of runs (predictions: runs x
    examples class ids; labels: the examples' class ids), with its interval: a dict of estimate,
    ci_low, ci_high, calibrated_level and calibrated_upper (EnsembleTally.calibration_error)."""
    predictions, labels, num_classes = _checked_predictions(predictions, labels, None)
    tally = EnsembleTally(labels, num_classes)
    for run in predictions:
        tally.add(run)
    return tally.calibration_error(confidence, bins, seed)


def sample_variance_interval(values, confidence):
    """The chi-square interval of the variance of normally spread values (n - 1 degrees of
    freedom): (low, high)."""
    n, variance = len(values), float(np.var(values, ddof=1))
    tail = (1 - confidence) / 2
    return ((n - 1) * variance / stats.chi2.ppf(1 - tail, n - 1),
            (n - 1) * variance / stats.chi2.ppf(tail, n - 1))


class EnsembleTally:
    """What the variance and calibration analyses need of a set of runs, taken one run at a time:
    each run's accuracy and the ensemble's vote counts (examples x classes; each example's count
    of runs correct is its label's). Its memory does not grow with the runs but by one number per
    run."""

    def __init__(self, labels, num_classes):
        self.labels = np.asarray(labels).ravel().astype(np.int64)
        self.votes = np.zeros((self.labels.size, num_classes), dtype=np.int64)
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
        self.votes[np.arange(self.labels.size), predictions] += 1
        self.accuracies.append(float((predictions == self.labels).mean()))

    def correct_counts(self):
        return self.votes[np.arange(self.labels.size), self.labels]

    def summary(self, confidence=0.95, seed=0):
        """The variance table's entry: n, mean accuracy, test-set std, distribution-wise variance
        and std, each std with its chi-square interval, and the calibration error with its
        interval. A distribution-wise variance estimated below 0 has no std (None, with
        distribution_wise_note), only the interval [0, high]."""
        if self.runs < 2:
            raise ValueError(f'variance between runs needs at least 2 runs, got {self.runs}')
        accuracies, examples = np.array(self.accuracies), self.labels.size
        low, high = sample_variance_interval(accuracies, confidence)
        estimate = float(_distribution_wise_variance(accuracies, self.correct_counts()))
        sampling = float(np.var(accuracies, ddof=1)) * examples / (examples - 1) - estimate
        dist_low, dist_high = (examples / (examples - 1) * bound - sampling
                               for bound in (low, high))
        return dict(
            n=self.runs, mean=float(accuracies.mean()),
            test_set_std=float(accuracies.std(ddof=1)),
            test_set_std_ci=[math.sqrt(low), math.sqrt(high)],
            distribution_wise_variance=estimate,
            distribution_wise_std=math.sqrt(estimate) if estimate >= 0 else None,
            distribution_wise_std_ci=[math.sqrt(max(dist_low, 0)), math.sqrt(max(dist_high, 0))],
            distribution_wise_note=None if estimate >= 0 else
            'estimated below 0: not distinguished from 0 (the interval is its upper bound)',
            calibration=self.calibration_error(confidence, seed=seed))

    def calibration_error(self, confidence=0.95, bins=CALIBRATION_BINS, seed=0):
        """The class-aggregated calibration error (class_aggregated_calibration_error) with:
        ci_low, ci_high: the basic bootstrap interval over test examples (RESAMPLES resamples; the
        reverse percentiles 2 * estimate - quantile, which undo the upward shift an absolute
        value gives resampled noise), for the value this estimator takes on test sets of this
        size; calibrated_level and calibrated_upper: the mean and the 1 - (1 - confidence) / 2
        quantile of the estimate when the labels are drawn from the ensemble's own vote shares
        (exactly calibrated: CALIBRATED_DRAWS label sets), the floor a finite test set gives."""
        if self.runs < 1:
            raise ValueError('a calibration error needs at least 1 run')
        rng = np.random.default_rng(seed)
        estimate = _calibration_error(self.votes, self.labels, self.runs, bins)
        examples, tail = self.labels.size, (1 - confidence) / 2
        resampled = []
        for _ in range(RESAMPLES):
            chosen = rng.integers(0, examples, examples)
            resampled.append(_calibration_error(self.votes[chosen], self.labels[chosen],
                                                self.runs, bins))
        low, high = np.quantile(resampled, [tail, 1 - tail])
        shares = self.votes.cumsum(axis=1) / self.runs
        calibrated = []
        for _ in range(CALIBRATED_DRAWS):
            drawn = (shares <= rng.random((examples, 1))).sum(axis=1)
            calibrated.append(_calibration_error(self.votes, np.minimum(
                drawn, self.votes.shape[1] - 1), self.runs, bins))
        return dict(estimate=estimate, ci_low=max(2 * estimate - float(high), 0.0),
                    ci_high=2 * estimate - float(low), confidence=confidence, bins=bins,
                    runs=self.runs, examples=examples,
                    calibrated_level=float(np.mean(calibrated)),
                    calibrated_upper=float(np.quantile(calibrated, 1 - tail)))
