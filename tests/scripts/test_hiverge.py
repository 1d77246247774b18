"""airbench94_hiverge.py's own method: the published hyperparameters, the batched orthogonalization
(equal to orthogonalizing each filter bank alone), the Muon step with its decoupled decay and its
growing renormalization interval, the brightness and contrast jitter's ranges, the selective TTA
(full TTA's logits on the least confident images, plain logits on the others; fraction 1 is full
TTA), the schedules, and its CUDA path: the meta device, fake CUDA tensors, no host
synchronization when timed, and every graph compiled in the warmup. What it shares with airbench94
is checked there once (tests/scripts/test_layout.py proves the blocks identical); conftest.SCRIPTS runs
the per-script checks on it."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import (CPU, FAKE_CUDA, in_fp32, load_script, needs_cpu_fp16_padding,
                      needs_fake_cuda, newton_schulz_by_svd, record_compiled_graphs, script_changes,
                      set_hyp, tiny_dataset, warm_up_as_on_cuda, with_hyp)

NAME = 'airbench94_hiverge'
# Every 3x3 filter bank of the network, flattened to out_channels x (in_channels * 9), in order
FILTER_SHAPES = [(64, 24 * 9), (64, 64 * 9), (256, 64 * 9), (256, 256 * 9), (256, 256 * 9),
                 (256, 256 * 9)]
COEFFICIENTS = (3.4576, -4.7391, 2.0843)
SMALL = {'block1': 8, 'block2': 8, 'block3': 8}
NO_AUTOCAST = torch.autocast('cpu', enabled=False)


@pytest.fixture(scope='module')
def hiverge():
    return load_script(NAME)


def small_net(hiverge, num_classes=10, seed=0):
    torch.manual_seed(seed)
    return hiverge.make_net(SMALL, num_classes, 0.5566, 1 / 8)


def test_hyperparameters_are_the_published_scripts(hiverge):
    opt, aug, arch = hiverge.hyp['opt'], hiverge.hyp['aug'], hiverge.hyp['net']
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
    net = hiverge.make_net(arch['widths'], 10, arch['batchnorm_momentum'], arch['scaling_factor'])
    activations = [type(m) for m in net.modules() if isinstance(m, (nn.GELU, nn.SiLU))]
    assert activations == [nn.GELU] + [nn.SiLU] * 3  # GELU after whitening; SiLU in the blocks
    assert all(block.activ.__class__ is nn.SiLU for block in net[2:5])


# ------------------------------------ The orthogonalization ------------------------------------
def padded_batch(matrices):
    rows, cols = max(m.size(0) for m in matrices), max(m.size(1) for m in matrices)
    return torch.stack([F.pad(m, (0, cols - m.size(1), 0, rows - m.size(0))) for m in matrices])


@pytest.mark.parametrize('tall', [False, True])
def test_batched_orthogonalization_equals_each_bank_alone(hiverge, tall):
    generator = torch.Generator().manual_seed(0)
    matrices = [torch.randn(shape, generator=generator) for shape in FILTER_SHAPES]
    matrices = [m.T for m in matrices] if tall else matrices
    batched = hiverge.orthogonalize(padded_batch(matrices), 3)
    assert batched.shape == (6, 2304, 256) if tall else (6, 256, 2304)
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


# Singular values after 3 steps over the filter shapes, wide and tall (measured here): bf16 0.792
# to 1.248, fp32 0.796 to 1.240, fp16 0.794 to 1.240. Required: every one in [0.75, 1.3].
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_newton_schulz_puts_every_singular_value_in_the_band(hiverge, dtype):
    generator = torch.Generator().manual_seed(0)
    for shape in FILTER_SHAPES[:4]:
        matrix = torch.randn(shape, generator=generator, dtype=torch.float64)
        for m in (matrix, matrix.T):
            result = hiverge.orthogonalize(m[None].to(dtype), 3)[0]
            singular_values = torch.linalg.svdvals(result.double())
            assert singular_values.min() > 0.75 and singular_values.max() < 1.3, m.shape
    expected = newton_schulz_by_svd(COEFFICIENTS, matrix, 3)
    assert torch.allclose(hiverge.orthogonalize(matrix[None].float(), 3)[0].double(), expected,
                          atol=1e-4)
    # The control: one step lifts the small singular values only part of the way
    one_step = hiverge.orthogonalize(matrix[None].to(dtype), 1)[0]
    assert torch.linalg.svdvals(one_step.double()).min() < 0.75


def test_muon_step_is_renormalization_then_orthogonal_update_then_decoupled_decay(hiverge):
    """Two banks of different shapes (so one is padded), float64, checked against the update
    computed for each bank alone by SVD."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 2, 3, 3), (6, 4, 3, 3)]
    weights = [nn.Parameter(torch.randn(shape, generator=generator, dtype=torch.float64))
               for shape in shapes]
    lr, momentum, decay = 0.205, 0.655, 1.0418e-6 * 1536
    optimizer = hiverge.Muon(weights, lr, momentum, 3, decay, torch.float64)
    expected = [w.detach().clone() for w in weights]
    buffers = [torch.zeros(shape, dtype=torch.float64) for shape in shapes]
    for renormalize in (True, False, True):
        grads = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
        for weight, grad in zip(weights, grads):
            weight.grad = grad.clone()
        optimizer.step(torch.tensor(renormalize))
        for i, (grad, shape) in enumerate(zip(grads, shapes)):
            buffers[i] = momentum * buffers[i] + grad
            nesterov = grad + momentum * buffers[i]
            if renormalize:  # Frobenius norm sqrt(out_channels)
                expected[i] = expected[i] * (shape[0]**0.5 / expected[i].norm())
            update = newton_schulz_by_svd(COEFFICIENTS, nesterov.flatten(1), 3).view(shape)
            expected[i] = (expected[i] - lr * update) * (1 - lr * decay)
            assert torch.allclose(weights[i].detach(), expected[i], atol=1e-10), (renormalize, i)
    assert abs(weights[0].norm().item() - 2.0) > 1e-3  # not renormalized at the last step alone
    weights[0].grad, before = None, weights[0].detach().clone()  # a frozen one is left alone
    weights[1].grad = torch.randn(shapes[1], generator=generator, dtype=torch.float64)
    optimizer.step(torch.tensor(False))
    assert torch.equal(weights[0].detach(), before)


def published_renormalization_counter(total_steps):
    """The published Muon's own bookkeeping, restated: step_count from 1, norm_freq = 2 +
    int(15 * progress), a renormalization when step_count - last_norm_step >= norm_freq."""
    last_norm_step, steps = 0, []
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


# ------------------------------------------ The jitter -----------------------------------------
def jittered_epoch(hiverge, images, brightness, contrast, seed=0):
    """The loader's epoch of uint8 images (N, H, W, 3) with the jitter alone (no flip, no
    translation), normalized by mean 0 and std 1 (pixel values 0 to 1)."""
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
    """Images whose left half is 1 and right half 0: after normalization (mean 0.5, std 0.5) +1
    and -1, jittered to (+1 + b) s and (-1 + b) s, so each image's b and s can be read back and
    the flip still shows as which half holds the larger value."""
    n = 512
    images = torch.zeros(n, 32, 32, 3, dtype=torch.uint8)
    images[:, :, :16] = 255
    aug = {**hiverge.hyp['aug'], 'translate': 0}
    loader = hiverge.CifarLoader(images, torch.arange(n), 128, (0.5,) * 3, (0.5,) * 3, aug,
                                 order_generator=torch.Generator().manual_seed(0),
                                 aug_generator=torch.Generator().manual_seed(1))
    epochs = []
    for _ in range(3):
        shifts, scales, mirrored = torch.empty(n), torch.empty(n), torch.empty(n, dtype=torch.bool)
        for batch, ids in loader:
            left, right = batch[:, 0, 0, 0], batch[:, 0, 0, -1]
            high, low = torch.maximum(left, right), torch.minimum(left, right)
            scales[ids], mirrored[ids] = (high - low) / 2, right > left
            shifts[ids] = (high + low) / 2 / scales[ids]
        assert shifts.abs().max() <= 0.1399 + 1e-5 and (scales - 1).abs().max() <= 0.1308 + 1e-5
        epochs.append((shifts, scales, mirrored))
    assert 0.4 < epochs[0][2].float().mean() < 0.6  # epoch 0 mirrors about half
    for (shifts, scales, mirrored), (next_shifts, next_scales, next_mirrored) in zip(epochs,
                                                                                    epochs[1:]):
        assert torch.all(mirrored != next_mirrored)  # alternating flip, as in airbench94
        assert (shifts - next_shifts).abs().min() < 0.01 and (shifts != next_shifts).all()
        assert (scales != next_scales).all()  # new draws every epoch


# --------------------------------------- The selective TTA ---------------------------------------
def view_logits(net, images, tta_level=2):
    """The mean of TTA's views (six at level 2, two at level 1), each evaluated alone: independent
    of infer's batching."""
    padded = F.pad(images, (1,) * 4, mode='reflect')
    views = [images, padded[:, :, :32, :32], padded[:, :, 2:, 2:]][:1 if tta_level == 1 else 3]
    with torch.no_grad():
        return sum(net(v) + net(v.flip(-1)) for v in views) / (2 * len(views))


def test_selective_tta_gives_full_tta_to_the_least_confident_and_plain_logits_to_the_others(
        hiverge):
    net = small_net(hiverge).eval()
    images = torch.randn(300, 3, 32, 32)
    plain = hiverge.infer(net, images, 0, NO_AUTOCAST, batch_size=64)
    with torch.no_grad():
        assert torch.allclose(plain, net(images), atol=1e-6)
    confidence = plain.softmax(1).amax(1)
    for tta_level, fraction in ((2, 0.25), (2, 0.5), (1, 0.25)):
        full = view_logits(net, images, tta_level)
        assert not torch.allclose(full, plain, atol=1e-3)
        selective = hiverge.infer(net, images, tta_level, NO_AUTOCAST, batch_size=64,
                                  tta_fraction=fraction)
        count = int(300 * fraction)
        chosen = torch.zeros(300, dtype=torch.bool)
        chosen[confidence.argsort()[:count]] = True  # the least confident
        assert confidence[chosen].max() <= confidence[~chosen].min()
        assert torch.allclose(selective[chosen], full[chosen], atol=1e-5)
        assert torch.equal(selective[~chosen], plain[~chosen])
    # Fraction 1 (the default) is full TTA; fraction 0, or level 0, plain evaluation
    full = view_logits(net, images)
    for logits in (hiverge.infer(net, images, 2, NO_AUTOCAST, batch_size=64, tta_fraction=1.0),
                   hiverge.infer(net, images, 2, NO_AUTOCAST, batch_size=64)):
        assert torch.allclose(logits, full, atol=1e-5)
    assert torch.equal(hiverge.infer(net, images, 2, NO_AUTOCAST, 64, tta_fraction=0.0), plain)
    assert torch.equal(hiverge.infer(net, images, 0, NO_AUTOCAST, 64, tta_fraction=0.25), plain)


def test_selective_tta_keeps_outputs_that_the_next_call_overwrites(hiverge):
    """CUDA graphs return the graph's own output buffer, overwritten by the next call. Simulated:
    a network with one output buffer for every batch size."""
    class OneOutputBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = {}

        def forward(self, x):
            out = self.out.setdefault(len(x), torch.zeros(len(x), 10))
            return out.copy_(x[:, :, 1:-1, 1:-1].mean((2, 3)).repeat(1, 4)[:, :10])

    images = torch.randn(40, 3, 32, 32)
    expected = view_logits(OneOutputBuffer(), images)
    logits = hiverge.infer(OneOutputBuffer(), images, 2, NO_AUTOCAST, batch_size=8)  # 5 batches
    assert torch.allclose(logits, expected, atol=1e-6)
    plain = hiverge.infer(OneOutputBuffer(), images, 0, NO_AUTOCAST, batch_size=8)
    assert torch.equal(plain, images[:, :, 1:-1, 1:-1].mean((2, 3)).repeat(1, 4)[:, :10])


# ------------------------------------------ Training -------------------------------------------
def test_schedules_renormalizations_and_the_whitening_bias(hiverge, monkeypatch):
    net = hiverge.build_net({**hiverge.hyp['net'], 'widths': SMALL}, 2, CPU, 'fp32')
    seen, sgd_lrs = [], []  # every step: Muon's lr and renormalization, the bias's gradient
    muon_step, sgd_step = hiverge.Muon.step, torch.optim.SGD.step
    def recording_muon_step(self, renormalize):  # its lr and renormalize: tensors
        seen.append((self.param_groups[0]['lr'].item(), renormalize.item(),
                     net[0].bias.grad is not None))
        return muon_step(self, renormalize)
    def recording_sgd_step(self):
        sgd_lrs.append([group['lr'] for group in self.param_groups])
        return sgd_step(self)
    monkeypatch.setattr(hiverge.Muon, 'step', recording_muon_step)
    monkeypatch.setattr(torch.optim.SGD, 'step', recording_sgd_step)
    hyp = with_hyp(hiverge.hyp, opt__batch_size=16, opt__train_epochs=9.9,
                   opt__whiten_bias_epochs=0.4)  # 4 steps per epoch: 40 steps, the bias 2
    result = hiverge.train(tiny_dataset(), hyp, CPU, 'fp32', 0, net=net, epoch_eval=False)
    assert result['steps'] == 40
    decay = [1 - step / 40 for step in range(40)]
    assert [lr for lr, _, _ in seen] == pytest.approx([0.205 * m for m in decay])
    renormalized = [step for step, (_, flag, _) in enumerate(seen) if flag]
    assert renormalized == [1, 4, 9, 17, 30]  # intervals 2, 3, 5, 8, 13
    assert [had_grad for _, _, had_grad in seen] == [True] * 2 + [False] * 38
    assert [lrs[0] for lrs in sgd_lrs[:2]] == pytest.approx([0.0573, 0.0573 / 2])
    assert [lrs[1] for lrs in sgd_lrs] == pytest.approx([0.0573 * m for m in decay])
    assert [lrs[2] for lrs in sgd_lrs] == pytest.approx([0.5415 * m for m in decay])


def test_muon_decays_at_the_scheduled_lr_and_sgd_groups_decay_per_example(hiverge, monkeypatch):
    made = []
    muon_init = hiverge.Muon.__init__
    def recording_init(self, params, *args, **kwargs):
        made.append(args)
        muon_init(self, params, *args, **kwargs)
    monkeypatch.setattr(hiverge.Muon, '__init__', recording_init)
    net = hiverge.build_net(hiverge.hyp['net'], 10, CPU, 'fp32')
    opt = hiverge.hyp['opt']
    filters, groups = hiverge.optimizer_groups(net, opt['bias_lr'], opt['head_lr'],
                                               opt['weight_decay'], opt['batch_size'])
    for group in groups:  # each step decays 1.0418e-6 per example of every weight, at the full lr
        assert group['lr'] * group['weight_decay'] == pytest.approx(1.0418e-6 * 1536)
    hyp = with_hyp(hiverge.hyp, opt__batch_size=16, opt__train_epochs=1, net__widths=SMALL)
    hiverge.train(tiny_dataset(), hyp, CPU, 'bf16', 0, epoch_eval=False)
    (args,) = made
    assert args == (0.205, 0.655, 3, pytest.approx(1.0418e-6 * 16), torch.bfloat16)


def test_cpu_path_eager_sgd_unfused_and_newton_schulz_in_bf16_or_fp32(hiverge, monkeypatch):
    fused, sgd_init = [], torch.optim.SGD.__init__
    def recording_init(self, params, **kwargs):
        fused.append(kwargs.get('fused'))
        sgd_init(self, params, **kwargs)
    monkeypatch.setattr(torch.optim.SGD, '__init__', recording_init)
    monkeypatch.setattr(torch, 'compile', lambda *args, **kwargs: pytest.fail('compiled on CPU'))
    dtypes, orthogonalize = [], hiverge.orthogonalize
    monkeypatch.setattr(hiverge, 'orthogonalize', lambda updates, steps: (
        dtypes.append(updates.dtype), orthogonalize(updates, steps))[1])
    hyp = with_hyp(hiverge.hyp, opt__batch_size=16, opt__train_epochs=0.5, net__widths=SMALL)
    for precision in ('bf16', 'fp32'):
        hiverge.train(tiny_dataset(), hyp, CPU, precision, seed=0, epoch_eval=False)
    assert fused == [False, False] and dtypes == [torch.bfloat16] * 2 + [torch.float32] * 2


def test_a_reused_network_trains_exactly_like_a_fresh_one_and_seeds_matter(hiverge):
    hyp = with_hyp(hiverge.hyp, opt__batch_size=16, opt__train_epochs=2, net__widths=SMALL)
    fresh = hiverge.train(tiny_dataset(), hyp, CPU, 'fp32', 3, epoch_eval=False)
    again = hiverge.train(tiny_dataset(), hyp, CPU, 'fp32', 3, net=fresh['net'], epoch_eval=False)
    assert fresh['epoch_train_losses'] == again['epoch_train_losses']
    other = hiverge.train(tiny_dataset(), hyp, CPU, 'fp32', 4, epoch_eval=False)
    assert other['epoch_train_losses'] != fresh['epoch_train_losses']


# ------------------------------------------ CUDA path ------------------------------------------
def test_whole_training_step_on_the_meta_device_in_the_cuda_recipe(hiverge):
    from test_cuda_path import recipe_dtypes, recipe_dtypes_held
    meta = torch.device('meta')
    net = hiverge.build_net(hiverge.hyp['net'], 10, meta, 'fp16')  # meta: not compiled
    expected = recipe_dtypes(net, 'airbench94_hiverge')
    assert expected['2.norm1.bias'] == expected['2.norm1.running_var'] == torch.float16
    assert recipe_dtypes_held(net, 'airbench94_hiverge')  # every layer in fp16, as published
    opt = hiverge.hyp['opt']
    filters, sgd_groups = hiverge.optimizer_groups(net, opt['bias_lr'], opt['head_lr'],
                                                   opt['weight_decay'], 16)
    sgd = torch.optim.SGD(sgd_groups, momentum=opt['momentum'], nesterov=True)
    muon = hiverge.Muon(filters, opt['filter_lr'], opt['filter_momentum'], 3, 0.0016,
                        torch.float16)
    inputs = torch.empty(16, 3, 32, 32, device=meta, dtype=torch.float16)
    outputs = net(inputs.contiguous(memory_format=torch.channels_last))
    loss = F.cross_entropy(outputs.float(), torch.empty(16, device=meta, dtype=torch.int64),
                           label_smoothing=0.09, reduction='sum')
    loss.backward()
    sgd.step()
    muon.step(torch.ones((), dtype=torch.bool, device=meta))
    assert outputs.dtype == torch.float16 and loss.dtype == torch.float32
    grads = {name: p.grad.dtype for name, p in net.named_parameters() if p.requires_grad}
    assert grads == {name: expected[name] for name in grads} and '2.norm1.bias' in grads
    assert recipe_dtypes_held(net, 'airbench94_hiverge')  # kept by the steps
    assert all(muon.state[p]['momentum'].dtype == torch.float16 for p in filters)  # as published
    logits = hiverge.infer(net, torch.empty(10, 3, 32, 32, device=meta, dtype=torch.float16), 2,
                           torch.autocast('cuda', enabled=False), batch_size=4, tta_fraction=0.5)
    assert logits.shape == (10, 10) and logits.dtype == torch.float32


@needs_fake_cuda
def test_loader_whitening_muon_and_selective_tta_on_fake_cuda(hiverge):
    """FakeTensorMode raises on a CPU tensor mixed in and on .item() or data-dependent shapes:
    topk, its indexing and index_copy need neither."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from test_cuda_path import fake_cuda
    mode = FakeTensorMode()
    net = fake_cuda(hiverge.build_net({**hiverge.hyp['net'], 'widths': SMALL}, 10, CPU, 'fp16'),
                    mode)
    with mode:
        images = torch.empty(300, 32, 32, 3, dtype=torch.uint8, device=FAKE_CUDA)
        labels = torch.empty(300, dtype=torch.int64, device=FAKE_CUDA)
        loader = hiverge.CifarLoader(images, labels, 64, (0.5,) * 3, (0.25,) * 3,
                                     hiverge.hyp['aug'], torch.float16)
        for _ in range(2):  # the first epoch (flip, pad) and a later one
            batches = list(loader)
            assert len(batches) == 4 and batches[0][0].shape == (64, 3, 32, 32)
            assert batches[0][0].device.type == 'cuda' and batches[0][0].dtype == torch.float16
        normalized = loader.normalize(loader.images)
        hiverge.init_whitening(net[0], normalized[:200], 5e-4)
        filters, _ = hiverge.optimizer_groups(net, 0.0573, 0.5415, 1e-6, 16)
        for weight in filters:
            weight.grad = torch.empty_like(weight)
        renormalize = torch.ones((), dtype=torch.bool, device=FAKE_CUDA)
        hiverge.Muon(filters, 0.205, 0.655, 3, 0.0016, torch.float16).step(renormalize)
        assert all(w.device.type == 'cuda' and w.dtype == torch.float16 for w in filters)
        logits = hiverge.infer(net, normalized, 2, torch.autocast('cuda', enabled=False),
                               tta_fraction=0.25)
        assert logits.shape == (300, 10) and logits.device.type == 'cuda'


@needs_cpu_fp16_padding
def test_no_host_synchronization_inside_the_timed_region(hiverge, monkeypatch):
    from test_cuda_path import recorded_train
    hyp = with_hyp(hiverge.hyp, opt__batch_size=16, opt__train_epochs=3.5, net__widths=SMALL)
    recorder, result = recorded_train(hiverge, monkeypatch, hyp, 'fp16')
    assert not recorder.timed and result['steps'] == 14
    assert {'aten.topk.default', 'aten.index_copy.default', 'aten.bmm.default'} <= recorder.ops
    assert recorder.timed_syncs == []
    assert 'aten._local_scalar_dense.default' in recorder.untimed_syncs  # the control


@pytest.mark.parametrize('num_test, bias_settings', [
    (2100, {}), (4100, {'opt.whiten_bias_epochs': 1.5})])
def test_every_graph_compiled_in_the_warmup_none_when_timed(hiverge, monkeypatch, tmp_path,
                                                           num_test, bias_settings):
    """compiles() forced on the CPU, graphs recorded by a backend that runs them eagerly: the
    warmup (2 batches of training images, the N test images) compiles the network's graphs
    (training, with the loss, with the whitening bias trained and frozen; evaluation at each batch
    size: 2000, the remainder, the selective TTA's 6 x 500 and 6 x its remainder, each once, the
    same before and after the freeze where an epoch's evaluation comes before it, as with 1.5
    epochs of the bias's training), Muon's step and the augmentation's; the timed run on N test
    images (and another number of training images) compiles none."""
    torch._dynamo.reset()  # graphs of earlier tests would count toward dynamo's recompile limit
    graphs = record_compiled_graphs(monkeypatch)
    monkeypatch.setattr(hiverge, 'compiles', lambda device: True)
    warmed = warm_up_as_on_cuda(monkeypatch, hiverge, graphs)
    data = tiny_dataset(per_class=32)
    test = tiny_dataset(per_class=num_test // 2)['train']
    monkeypatch.setattr(hiverge, 'load_dataset', lambda *args, **kwargs: {**data, 'test': test})
    in_fp32(monkeypatch, hiverge)
    set_hyp(monkeypatch, hiverge, {'opt.batch_size': 16, 'net.widths': SMALL}, bias_settings)
    code = hiverge.main(['--runs', '1', '--seed', '0', '--epochs', '2', '--device', 'cpu',
                         '--log-dir', str(tmp_path)])
    assert code == 0
    assert warmed == [len(graphs)] and len(graphs) == 8  # every one in the warmup, none when timed
    images = [[shape for shape in shapes if shape[1:] == (3, 32, 32)] for shapes in graphs]
    network = [batch[0][0] for batch in images if len(batch) == 1]
    remainder = num_test % 2000
    # training's batches of 16 (trainable, frozen); the plain pass's 2000 and remainder; the TTA's
    # views of 500 and of the remainder's quarter
    assert sorted(network) == sorted([16, 16, 2000, remainder, 6 * 500, 6 * remainder // 4])
    # The augmentation of every epoch: one graph, for any number of images (the warmup's 32, the
    # run's 64), from the padded images
    assert len([shapes for shapes in graphs if (32, 3, 36, 36) in shapes]) == 1
    # Muon's whole step: one graph, of the six banks' weights, gradients and momentum buffers
    # (8 x 24 x 3 x 3 and 8 x 8 x 3 x 3 at these widths), its lr and its renormalization
    banks = [(8, 24, 3, 3)] + [(8, 8, 3, 3)] * 5
    assert len([shapes for shapes in graphs if sorted(shapes) == sorted(banks * 3 + [(), ()])]) == 1
