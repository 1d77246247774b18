"""stand_in_script.py: a stand-in for the airbench scripts, to measure and test study.py's engine.
Its train returns at once: the TTA accuracy of a run of E epochs is 1 - (c + b * E^a) of CURVE plus
Gaussian noise of std NOISE (hyp['curve']), drawn from the run's three seeds and rounded to a whole
number of test images (with curve.diverges, chance: the loss is not finite); infer's logits have
exactly that accuracy on the test set train saw. The timed seconds are an A100's 3.83 s per 9.9
epochs plus 1% noise (made up, to have a figure).

Only the method: study.py takes the rest (data, flags) from the repository's shared part, as it does
for any copy that defines its method alone.
"""
import math
from math import inf

import torch
from torch import nn

hyp = {
    'opt': {'train_epochs': 9.9, 'batch_size': 1024},
    'aug': {'flip': 'alternating'},
    'net': {'tta_level': 2},
    'curve': {'a': -1.0, 'b': 0.2, 'c': 0.04, 'noise': 0.0015,  # error = c + b * epochs^a
              'diverges': False},  # True: every run's loss is not finite (a diverged run), and
    #                      it ends at chance accuracy, as a network whose weights are not finite
}

# The values hyp takes: each switch's choices, each number's inclusive range (widths and a
# tuple: each element's); a number in neither keeps the sign of hyp's. The command line and
# study.py refuse any other value before training.
HYP_CHOICES = {
    'aug.flip': ('alternating', 'random', 'none'),
    'net.tta_level': (0, 1, 2),
}
HYP_RANGES = {
    'opt.train_epochs': (0.001, inf),
    'opt.batch_size': (1, inf),
}
EVAL_BATCH_SIZE = 2000
A100_SECONDS_PER_EPOCH = 3.83 / 9.9


class CifarLoader:
    """The normalization of the scripts' loader: what study.py uses to compute saved logits."""

    def __init__(self, images, labels, batch_size, mean, std, aug, dtype=torch.float32,
                 order_generator=None, aug_generator=None, sampling='reshuffle'):
        self.images = images.permute(0, 3, 1, 2).to(dtype) / 255
        self.mean = torch.tensor(mean, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=images.device, dtype=dtype).view(1, -1, 1, 1)

    def normalize(self, images):
        return (images - self.mean) / self.std


class StandIn(nn.Module):
    """No weights to train: what infer answers for the test images train saw (their labels, the
    run's accuracy and seed)."""

    def __init__(self, num_classes):
        super().__init__()
        self.num_classes = num_classes
        self.planned = None


def build_net(arch, num_classes, device, precision):
    return StandIn(num_classes)


def source_seeds(seed):
    """Seeds of the three sources of randomness, as the scripts draw them."""
    seeds = torch.randint(2**62, (3,), generator=torch.Generator().manual_seed(seed)).tolist()
    return dict(zip(('init', 'order', 'aug'), seeds))


def run_seed(seeds):
    """One seed from the three: the run's noise changes with any of them."""
    return (seeds['init'] * 3 + seeds['order'] * 5 + seeds['aug'] * 7) % 2**62


def accuracy_of(curve, epochs, seeds, num_test):
    """The run's TTA accuracy: the curve at these epochs plus its noise, in whole test images."""
    noise = torch.randn(1, generator=torch.Generator().manual_seed(run_seed(seeds)),
                        dtype=torch.float64).item()
    accuracy = 1 - (curve['c'] + curve['b'] * epochs ** curve['a']) + curve['noise'] * noise
    return round(min(max(accuracy, 0.0), 1.0) * num_test) / num_test


def train(data, hyp, device, precision, seed, net=None, epoch_eval=True, on_epoch=None):
    seeds = seed if isinstance(seed, dict) else source_seeds(seed)
    epochs = hyp['opt']['train_epochs']
    labels = data['test']['labels']
    net = build_net(hyp['net'], len(data['classes']), device, precision) if net is None else net
    accuracy = accuracy_of(hyp['curve'], epochs, seeds, len(labels))
    if hyp['curve']['diverges']:  # weights not finite: one class for every image, chance
        accuracy = round(len(labels) / len(data['classes'])) / len(labels)
    net.planned = (labels, accuracy, run_seed(seeds))
    steps = math.ceil(len(data['train']['labels']) // hyp['opt']['batch_size'] * epochs)
    noise = torch.randn(1, generator=torch.Generator().manual_seed(run_seed(seeds) + 1)).item()
    return dict(seed=seed, seeds=seeds, steps=steps, net=net, tta_val_acc=accuracy,
                val_acc=accuracy if epoch_eval else None,
                epoch_train_losses=[math.nan if hyp['curve']['diverges'] else 1.0]
                * math.ceil(epochs),
                total_time_seconds=A100_SECONDS_PER_EPOCH * epochs * (1 + 0.01 * noise))


def infer(net, images, tta_level, autocast, batch_size=EVAL_BATCH_SIZE):
    """Logits (fp32) of the planned accuracy on the test images train saw (any TTA level: the
    stand-in has one accuracy), seeded random ones for other images."""
    labels, accuracy, seed = net.planned
    generator = torch.Generator().manual_seed(seed + tta_level)
    logits = torch.randn(len(images), net.num_classes, generator=generator)
    if len(images) != len(labels):
        return logits.to(images.device)
    labels = labels.cpu()
    correct = torch.zeros(len(labels), dtype=torch.bool)
    correct[torch.randperm(len(labels), generator=generator)[:round(accuracy * len(labels))]] = True
    rows = torch.arange(len(labels))
    logits[rows, labels] = torch.where(correct, logits.max(1).values + 1, logits.min(1).values - 1)
    return logits.to(images.device)
