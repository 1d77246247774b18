"""Variance between runs and calibration of the ensemble of runs (airbench paper, section
"Variance and class-wise calibration", table tab:variance).

Inputs are numpy arrays (torch tensors are converted with np.asarray after .cpu()): per-run
accuracies as fractions; `correct`, runs x test examples, 1 where the run classified the example
correctly; `predictions`, runs x test examples, each run's predicted class ids.
"""
import math

import numpy as np

VOTE_CHUNK_RUNS = 256  # runs counted at once by ensemble_votes (bounds its memory)


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
    runs, examples = correct.shape
    rates = correct.mean(axis=0)
    accuracy_variance = correct.mean(axis=1).var(ddof=1)
    example_variances = rates * (1 - rates) * runs / (runs - 1)
    return float(examples / (examples - 1)
                 * (accuracy_variance - example_variances.sum() / examples ** 2))


def distribution_wise_std(correct):
    """sqrt(max(distribution_wise_variance(correct), 0)), a fraction: 0.0 where the unbiased
    variance estimate is negative (call distribution_wise_variance to see the negative value)."""
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


def class_aggregated_calibration_error(predictions, labels, bins=None, num_classes=None):
    """Class-aggregated calibration error (CACE) of the ensemble of runs.

    Jiang, Nagarajan, Baek and Kolter, "Assessing Generalization of SGD via Disagreement" (ICLR
    2022), Definition 4.4, for the ensemble h~ whose probability of class k on x is the fraction
    of runs predicting k (hard predictions):

        CACE = integral over q of |sum_k P(Y = k, h~_k(X) = q) / sum_k P(h~_k(X) = q) - q|
                                  * sum_k P(h~_k(X) = q) dq.

    Classes are pooled within each confidence level q (not compared class by class) and the
    weights are not divided by K, so CACE lies in [0, K]. On N test examples and R runs,
    h~_k(x_i) = v_ik / R for vote counts v_ik, and the integral is a sum over levels v:

        CACE = (1 / N) * sum_v | #{(i, k): v_ik = v, y_i = k} - (v / R) * #{(i, k): v_ik = v} |.

    bins=None uses every level (exact for the empirical distribution; with thousands of runs most
    levels hold few examples and the absolute value turns their noise into a positive bias).
    bins=B groups consecutive levels into about B bins of equal mass of (example, class) pairs,
    level v going to bin floor(B * F(v)) with F(v) the fraction of pairs with fewer votes (a
    level is never split), and compares each bin's label count with its summed confidences:
    CACE = (1 / N) * sum_b | sum_{(i, k) in b} (1[y_i = k] - v_ik / R) |, i.e. the definition
    with q the bin's mean confidence.

    predictions: runs x examples class ids; labels: the examples' class ids. num_classes
    defaults to 1 + the largest id seen (with bins=None the result does not depend on it).
    """
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
    runs = predictions.shape[0]
    num_classes = num_classes or int(max(predictions.max(), labels.max())) + 1
    if max(predictions.max(), labels.max()) >= num_classes:
        raise ValueError(f'class ids must be below num_classes={num_classes}')
    votes = ensemble_votes(predictions, num_classes)
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
