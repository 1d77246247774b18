"""airbench94_hiverge.py's own method; what it shares with airbench94 is tested there
(test_layout.py proves the blocks identical), what it shares with airbench94_muon in
test_muon.py."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import load_script, script_changes

NAME = 'airbench94_hiverge'
# The 3x3 filter banks of a network of TINY_WIDTHS, flattened: of several shapes, as the network's
BANKS = [(8, 24 * 9), (8, 8 * 9), (16, 8 * 9), (16, 16 * 9), (16, 16 * 9), (16, 16 * 9)]
SMALL = {'block1': 8, 'block2': 8, 'block3': 8}
NO_AUTOCAST = torch.autocast('cpu', enabled=False)


@pytest.fixture(scope='module')
def hiverge():
    return load_script(NAME)


def small_net(hiverge, num_classes=10, seed=0):
    torch.manual_seed(seed)
    return hiverge.make_net(SMALL, num_classes, 0.5566, 1 / 8)


def test_hyperparameters_are_the_published_scripts(hiverge):
    opt = hiverge.hyp['opt']
    aug = hiverge.hyp['aug']
    arch = hiverge.hyp['net']
    assert opt == dict(train_epochs=7.65, batch_size=1536, filter_lr=0.205, filter_momentum=0.655,
                       newton_schulz_steps=3, renorm_every=(2, 17), head_lr=0.5415, bias_lr=0.0573,
                       momentum=0.825, weight_decay=1.0418e-6, label_smoothing=0.09,
                       whiten_bias_epochs=0.2)
    assert aug == dict(flip='alternating', translate=2, brightness=0.1399, contrast=0.1308)
    assert arch == dict(widths={'block1': 64, 'block2': 256, 'block3': 256},
                        batchnorm_momentum=0.5566, scaling_factor=1 / 256, whiten_images=960,
                        whiten_eps=5e-4, tta_level=2, tta_fraction=0.25,
                        compile_mode='max-autotune')  # model.compile(mode="max-autotune")
    steps_per_epoch = 50000 // opt['batch_size']  # docs/layout.md's 245 steps of 32 an epoch; 7
    assert (steps_per_epoch, math.ceil(steps_per_epoch * opt['train_epochs']),
            math.ceil(steps_per_epoch * opt['whiten_bias_epochs'])) == (32, 245, 7)
    changes = script_changes(NAME)
    assert '245 steps of 32 per epoch' in changes and '= 7' in changes
    net = small_net(hiverge)
    activations = [type(m) for m in net.modules() if isinstance(m, (nn.GELU, nn.SiLU))]
    assert activations == [nn.GELU] + [nn.SiLU] * 3  # GELU after whitening; SiLU in the blocks
    assert all(block.activ.__class__ is nn.SiLU for block in net[2:5])


def padded_batch(matrices):
    rows = max(m.size(0) for m in matrices)
    cols = max(m.size(1) for m in matrices)
    return torch.stack([F.pad(m, (0, cols - m.size(1), 0, rows - m.size(0))) for m in matrices])


@pytest.mark.parametrize('tall', [False, True])
def test_batched_orthogonalization_equals_each_bank_alone(hiverge, tall):
    generator = torch.Generator().manual_seed(0)
    matrices = [torch.randn(shape, generator=generator) for shape in BANKS]
    matrices = [m.T for m in matrices] if tall else matrices
    batched = hiverge.orthogonalize(padded_batch(matrices), 3)
    assert batched.shape == ((6, 216, 16) if tall else (6, 16, 216))
    for matrix, result in zip(matrices, batched):
        rows, cols = matrix.shape
        alone = hiverge.orthogonalize(matrix[None], 3)[0]
        assert torch.allclose(result[:rows, :cols], alone, atol=1e-5), matrix.shape
        assert not result[rows:].any() and not result[:, cols:].any()  # the padding stays zero
    # The control: had the batch been normalized as one, the small banks would differ
    joint = hiverge.orthogonalize(padded_batch(matrices).flatten(0, 1)[None], 3)[0]
    rows, cols = matrices[0].shape
    assert not torch.allclose(joint[:rows, :cols], hiverge.orthogonalize(matrices[0][None], 3)[0],
                              atol=1e-2)


def published_renormalization_counter(total_steps):
    """The published Muon's own bookkeeping, restated (its step_count counts from 1)."""
    last_norm_step = 0
    steps = []
    for step_count in range(1, total_steps + 1):
        norm_freq = 2 + int(15 * (step_count / total_steps))
        if step_count - last_norm_step >= norm_freq:
            last_norm_step = step_count
            steps.append(step_count - 1)  # as a 0-based step of train()
    return steps


@pytest.mark.parametrize('total_steps', [245, 1000, 40, 16])
def test_renormalization_interval_grows_from_2_to_17_steps(hiverge, total_steps):
    due = hiverge.renormalization_steps(total_steps, 2, 17)
    steps = [step for step, renormalize in enumerate(due) if renormalize]
    assert len(due) == total_steps and steps == published_renormalization_counter(total_steps)
    if total_steps == 16:  # the interval outgrows the steps taken: never, in the published too
        assert steps == []
        return
    intervals = [b - a for a, b in zip([-1] + steps, steps)]
    assert intervals[0] == 2 and max(intervals) <= 17
    assert intervals == sorted(intervals)  # never shorter than before
    if total_steps == 245:  # the full schedule: 37 renormalizations, the last intervals 15 and 16
        assert len(steps) == 37 and steps[:4] == [1, 3, 5, 7] and intervals[-2:] == [15, 16]


def jittered_epoch(hiverge, images, brightness, contrast, seed=0):
    """The loader's epoch of uint8 images (N, H, W, 3) with the jitter alone, pixel values 0-1."""
    aug = dict(flip='none', translate=0, brightness=brightness, contrast=contrast)
    loader = hiverge.CifarLoader(images, torch.zeros(len(images), dtype=torch.int64), len(images),
                                 (0.0,) * 3, (1.0,) * 3, aug,
                                 aug_generator=torch.Generator().manual_seed(seed))
    return loader.augmented_epoch()


def jitter_draws(hiverge, n, brightness, contrast, seed=0):
    """(shifts, scales) the loader draws for n images: from its epochs of all-zero and all-one
    images with the same generator seed, (0 + b) s and (1 + b) s."""
    outputs = [jittered_epoch(hiverge, torch.full((n, 4, 4, 3), value, dtype=torch.uint8),
                              brightness, contrast, seed) for value in (0, 255)]
    for out in outputs:  # one shift and one scale per image, the same for every pixel and channel
        assert torch.equal(out, out[:, :1, :1, :1].expand_as(out))
    scales = (outputs[1] - outputs[0])[:, 0, 0, 0]
    return outputs[0][:, 0, 0, 0] / scales, scales


def test_jitter_shifts_and_scales_each_image_uniformly_within_its_ranges(hiverge):
    shifts, scales = jitter_draws(hiverge, 20000, 0.1399, 0.1308)
    assert shifts.abs().max() <= 0.1399 + 1e-6 and (scales - 1).abs().max() <= 0.1308 + 1e-6
    assert shifts.min() < -0.139 and shifts.max() > 0.139  # the whole range is reached
    assert scales.min() < 1 - 0.13 and scales.max() > 1 + 0.13
    for draws, half_width, centre in ((shifts, 0.1399, 0.0), (scales, 0.1308, 1.0)):
        uniform = (draws - centre) / half_width  # uniform on [-1, 1]: mean 0, variance 1/3
        assert abs(uniform.mean()) < 0.02 and abs(uniform.var() - 1 / 3) < 0.01
        assert abs((uniform.abs() < 0.5).float().mean() - 0.5) < 0.02
    assert abs(torch.corrcoef(torch.stack([shifts, scales]))[0, 1]) < 0.03  # independent draws
    # Off when both ranges are 0; the same generator seed gives the same draws
    images = torch.randint(0, 256, (8, 4, 4, 3), dtype=torch.uint8)
    plain = images.permute(0, 3, 1, 2).float() / 255
    assert torch.equal(jittered_epoch(hiverge, images, 0.0, 0.0), plain)
    assert not torch.equal(jittered_epoch(hiverge, images, 0.1399, 0.1308), plain)
    again = jitter_draws(hiverge, 20000, 0.1399, 0.1308)
    assert torch.equal(again[0], shifts) and torch.equal(again[1], scales)


def test_loader_jitters_every_image_anew_each_epoch_after_the_flip(hiverge):
    """Halves normalized to +1 and -1, jittered to (+1 + b) s and (-1 + b) s: each image's b and s
    can be read back, and the flip as which half holds the larger value."""
    n = 512
    images = torch.zeros(n, 32, 32, 3, dtype=torch.uint8)
    images[:, :, :16] = 255
    aug = {**hiverge.hyp['aug'], 'translate': 0}
    loader = hiverge.CifarLoader(images, torch.arange(n), 128, (0.5,) * 3, (0.5,) * 3, aug,
                                 order_generator=torch.Generator().manual_seed(0),
                                 aug_generator=torch.Generator().manual_seed(1))
    epochs = []
    for _ in range(3):
        shifts = torch.empty(n)
        scales = torch.empty(n)
        mirrored = torch.empty(n, dtype=torch.bool)
        for batch, ids in loader:
            left = batch[:, 0, 0, 0]
            right = batch[:, 0, 0, -1]
            high = torch.maximum(left, right)
            low = torch.minimum(left, right)
            scales[ids] = (high - low) / 2
            mirrored[ids] = right > left
            shifts[ids] = (high + low) / 2 / scales[ids]
        assert shifts.abs().max() <= 0.1399 + 1e-5 and (scales - 1).abs().max() <= 0.1308 + 1e-5
        epochs.append((shifts, scales, mirrored))
    assert 0.4 < epochs[0][2].float().mean() < 0.6  # epoch 0 mirrors about half
    for (shifts, scales, mirrored), (next_shifts, next_scales, next_mirrored) in zip(epochs,
                                                                                    epochs[1:]):
        assert torch.all(mirrored != next_mirrored)  # alternating flip, as in airbench94
        assert (shifts - next_shifts).abs().min() < 0.01 and (shifts != next_shifts).all()
        assert (scales != next_scales).all()  # new draws every epoch


def view_logits(net, images, tta_level=2):
    """The mean of TTA's views, each evaluated alone: independent of infer's batching."""
    padded = F.pad(images, (1,) * 4, mode='reflect')
    views = [images, padded[:, :, :32, :32], padded[:, :, 2:, 2:]][:1 if tta_level == 1 else 3]
    with torch.no_grad():
        return sum(net(v) + net(v.flip(-1)) for v in views) / (2 * len(views))


def test_selective_tta_gives_full_tta_to_the_least_confident_and_plain_logits_to_the_others(
        hiverge):
    net = small_net(hiverge).eval()
    images = torch.randn(48, 3, 32, 32)  # batches of 32 and 16
    plain = hiverge.infer(net, images, 0, NO_AUTOCAST, batch_size=32)
    with torch.no_grad():
        assert torch.allclose(plain, net(images), atol=1e-6)
    confidence = plain.softmax(1).amax(1)
    for tta_level, fraction in ((2, 0.25), (2, 0.5), (1, 0.25)):
        full = view_logits(net, images, tta_level)
        assert not torch.allclose(full, plain, atol=1e-3)
        selective = hiverge.infer(net, images, tta_level, NO_AUTOCAST, batch_size=32,
                                  tta_fraction=fraction)
        count = int(48 * fraction)
        chosen = torch.zeros(48, dtype=torch.bool)
        chosen[confidence.argsort()[:count]] = True  # the least confident
        assert confidence[chosen].max() <= confidence[~chosen].min()
        assert torch.allclose(selective[chosen], full[chosen], atol=1e-5)
        assert torch.equal(selective[~chosen], plain[~chosen])
    # Fraction 1 (the default) is full TTA; fraction 0, or level 0, plain evaluation
    full = view_logits(net, images)
    for logits in (hiverge.infer(net, images, 2, NO_AUTOCAST, batch_size=32, tta_fraction=1.0),
                   hiverge.infer(net, images, 2, NO_AUTOCAST, batch_size=32)):
        assert torch.allclose(logits, full, atol=1e-5)
    assert torch.equal(hiverge.infer(net, images, 2, NO_AUTOCAST, 32, tta_fraction=0.0), plain)
    assert torch.equal(hiverge.infer(net, images, 0, NO_AUTOCAST, 32, tta_fraction=0.25), plain)
