"""The paper's raw accuracies (tab:altflip_cifar10) and the speedups of alternating flip printed
from them (tab:altflip, airbench94 rows), which test_fits.py recomputes. Both are rounded, so a
recomputed speedup may differ by the rounding of both (rounding_bound, half_unit)."""
import numpy as np

from studylib.stats.fits import effective_speedup

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
RANDOM = 1
ALTERNATING = 2
# tab:altflip, airbench94 rows: speedup in percent as printed (its digits set the tolerance)
PAPER_SPEEDUPS = {
    (False, False): ('15.0', '27.1', '38.3', '102'),
    (False, True): ('5.30', '21.3', '36.4', '31.8'),
    (True, False): ('3.84', '7.42', '18.6', '29.2'),
    (True, True): ('1.13', '2.00', '9.28', '14.25'),
}
RAW_HALF_UNIT = 0.00005 / 100  # the raw table's rounding (4 decimals of a percent), as a fraction


def accuracies(cutout, tta, flip):
    """As fractions, which the fits take."""
    return [row[flip] / 100 for row in RAW_ACCURACIES[(cutout, tta)]]


def rounding_bound(cutout, tta, index):
    """How far (percentage points, to first order, worst case) the raw table's rounding alone can
    move a recomputed speedup: each of the 5 accuracies it uses moved by half a unit (up to 0.8
    points, at 80 epochs)."""
    baseline = np.array(accuracies(cutout, tta, RANDOM))
    alternating = accuracies(cutout, tta, ALTERNATING)[index]

    def moved(j, sign):  # accuracy j (4: alternating flip's) moved by half a unit up or down
        shift = sign * RAW_HALF_UNIT * np.eye(5)[j]
        return 100 * effective_speedup(EPOCHS, baseline + shift[:4], EPOCHS[index],
                                       alternating + shift[4])
    return sum(abs(moved(j, 1) - moved(j, -1)) / 2 for j in range(5))


def half_unit(printed):
    """The paper's own rounding: half a unit of the last digit printed ('27.1': 0.05)."""
    return 0.5 * 10 ** -len(printed.partition('.')[2])
