"""Recompute the paper's effective speedups of alternating over random flip (table tab:altflip,
airbench94 rows) from its raw accuracies (table tab:altflip_cifar10), and print both side by side.

What reproduces the paper: per (Cutout, TTA), an unweighted least-squares fit of
error = c + b * epochs**a to random flip's four mean errors (10, 20, 40 and 80 epochs; fractions or
percent give the same epochs), inverted at alternating flip's mean error at each epoch count:
speedup = equivalent epochs / epochs - 1. 14 of the 16 cells then agree with the paper to its
printed digits, allowing for the raw table's own rounding to 4 decimals (column tolerance_pp).
The other two, and the worked example's "25.3 epochs", are explained in the notes printed below.

Usage: python tools/paper_speedups.py
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from studylib.stats.fits import effective_speedup, epochs_to_accuracy, fit_power_law  # noqa: E402

EPOCHS = (10, 20, 40, 80)
# tab:altflip_cifar10: mean test accuracy in percent over n=400 runs, per (Cutout, TTA) and epoch
# count: (no flip, random flip, alternating flip)
RAW_ACCURACIES = {
    (False, False): ((92.3053, 93.0988, 93.2798), (92.8166, 93.7446, 93.8652),
                     (93.0143, 94.0133, 94.0729), (93.0612, 94.1169, 94.1628)),
    (False, True): ((93.4071, 93.9488, 94.0186), (93.8528, 94.5565, 94.6530),
                    (94.0381, 94.7803, 94.8203), (94.0638, 94.8506, 94.8676)),
    (True, False): ((91.8487, 92.0402, 92.1374), (92.8474, 93.3825, 93.4876),
                    (93.2675, 94.1014, 94.1952), (93.4193, 94.4311, 94.5204)),
    (True, True): ((92.6455, 92.7780, 92.8103), (93.7862, 94.1306, 94.1670),
                   (94.3090, 94.8511, 94.8960), (94.5253, 95.1839, 95.2362)),
}
RANDOM, ALTERNATING = 1, 2
# tab:altflip, airbench94 rows: speedup in percent as printed, per epoch count
PAPER_SPEEDUPS = {
    (False, False): ('15.0', '27.1', '38.3', '102'),
    (False, True): ('5.30', '21.3', '36.4', '31.8'),
    (True, False): ('3.84', '7.42', '18.6', '29.2'),
    (True, True): ('1.13', '2.00', '9.28', '14.25'),
}
RAW_HALF_UNIT = 0.00005 / 100  # the raw table's rounding (4 decimals of a percent), as a fraction
NOTES = {
    (False, False, 80): 'extrapolation: 161 equivalent epochs, twice the longest run measured; '
                        'alternating error only 0.03 points above the asymptote c',
    (False, True, 20): 'not reproduced: 21.30% follows from an alternating accuracy of 94.6430 '
                       '(table: 94.6530), the only one-digit misprint among this '
                       "configuration's 8 values that gives it",
    (True, True, 10): 'not reproduced: 1.13% needs an alternating accuracy of 92.8063 (table: '
                      "92.8103); no misprint of 1 or 2 digits among this configuration's 8 "
                      'values gives it (a 0.004-point difference, below the runs\' +-0.014 CI)',
}


def accuracies(cutout, tta, flip):
    """The raw table's mean accuracies of one flip option at EPOCHS, as fractions."""
    return [row[flip] / 100 for row in RAW_ACCURACIES[(cutout, tta)]]


def speedup_percent(baseline, alternating, epochs):
    return 100 * effective_speedup(EPOCHS, baseline, epochs, alternating)


def rounding_bound(cutout, tta, index):
    """Worst-case change (percentage points, to first order) of a recomputed speedup when each raw
    accuracy it uses moves by the table's half unit of rounding."""
    baseline = accuracies(cutout, tta, RANDOM)
    alternating = accuracies(cutout, tta, ALTERNATING)[index]
    epochs = EPOCHS[index]
    bound = abs(speedup_percent(baseline, alternating + RAW_HALF_UNIT, epochs)
                - speedup_percent(baseline, alternating - RAW_HALF_UNIT, epochs)) / 2
    for j in range(len(EPOCHS)):
        up, down = list(baseline), list(baseline)
        up[j] += RAW_HALF_UNIT
        down[j] -= RAW_HALF_UNIT
        bound += abs(speedup_percent(up, alternating, epochs)
                     - speedup_percent(down, alternating, epochs)) / 2
    return bound


def half_unit(printed):
    """Half a unit of the last printed digit of a number such as '27.1' or '102'."""
    decimals = len(printed.partition('.')[2])
    return 0.5 * 10 ** -decimals


def recompute():
    """One row per airbench94 cell of tab:altflip: the paper's speedup, ours, the equivalent
    random-flip epochs, and whether they agree within tolerance_pp (the paper's rounding plus
    the raw table's)."""
    rows = []
    for (cutout, tta), printed in PAPER_SPEEDUPS.items():
        baseline = accuracies(cutout, tta, RANDOM)
        for index, epochs in enumerate(EPOCHS):
            alternating = accuracies(cutout, tta, ALTERNATING)[index]
            ours = speedup_percent(baseline, alternating, epochs)
            paper = float(printed[index])
            tolerance = half_unit(printed[index]) + rounding_bound(cutout, tta, index)
            rows.append({'cutout': cutout, 'tta': tta, 'epochs': epochs,
                         'paper_pct': paper, 'ours_pct': round(ours, 3),
                         'diff_pp': round(ours - paper, 3), 'tolerance_pp': round(tolerance, 3),
                         'matched': abs(ours - paper) <= tolerance,
                         'equivalent_epochs': round(epochs_to_accuracy(EPOCHS, baseline,
                                                                       alternating), 3),
                         'note': NOTES.get((cutout, tta, epochs), '')})
    return rows


def worked_example():
    """The paper's example (random flip, no Cutout, no TTA; alternating at 20 epochs): equivalent
    epochs from the 4-point fit and from the 20/40/80-epoch fit, and linear interpolation."""
    baseline = accuracies(False, False, RANDOM)
    alternating = accuracies(False, False, ALTERNATING)[1]
    four_points = epochs_to_accuracy(EPOCHS, baseline, alternating)
    last_three = epochs_to_accuracy(EPOCHS[1:], baseline[1:], alternating)
    error_20, error_40, target = 1 - baseline[1], 1 - baseline[2], 1 - alternating
    linear = 20 + 20 * (error_20 - target) / (error_20 - error_40)
    return {'four_point_epochs': four_points, 'four_point_speedup': four_points / 20 - 1,
            'last_three_epochs': last_three, 'last_three_speedup': last_three / 20 - 1,
            'linear_epochs': linear, 'linear_speedup': linear / 20 - 1}


def main():
    import pandas as pd
    pd.set_option('display.width', 250)
    pd.set_option('display.max_colwidth', 120)
    for (cutout, tta) in RAW_ACCURACIES:
        law = fit_power_law(EPOCHS, [1 - a for a in accuracies(cutout, tta, RANDOM)])
        print(f'random flip, cutout={cutout}, tta={tta}: error = {law.c:.5f} + {law.b:.5f} '
              f'* epochs^{law.a:.4f}')
    table = pd.DataFrame(recompute())
    print(table.to_string(index=False))
    print(f'{table.matched.sum()} of {len(table)} cells matched')
    example = worked_example()
    print(f"worked example: 4-point fit {example['four_point_epochs']:.2f} epochs, speedup "
          f"{100 * example['four_point_speedup']:.1f}% (paper: 25.3 epochs, 27%, table 27.1%); "
          f"20/40/80-epoch fit {example['last_three_epochs']:.2f} epochs "
          f"({100 * example['last_three_speedup']:.1f}%); linear interpolation between 20 and "
          f"40 epochs {example['linear_epochs']:.2f} epochs "
          f"({100 * example['linear_speedup']:.1f}%; paper: 52%)")


if __name__ == '__main__':
    main()
