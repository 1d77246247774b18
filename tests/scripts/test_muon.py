"""The Muon scripts' own method, each property once for airbench94_muon and airbench94_hiverge;
what they share with airbench94 is tested there (test_layout.py proves the blocks identical)."""
import pytest
import torch
from torch import nn

from conftest import CPU, TINY_WIDTHS, load_script, spy, tiny_dataset, tiny_hyp
from studylib.hyp import with_entries

MUON_SCRIPTS = ['airbench94_muon', 'airbench94_hiverge']
# The network's 3x3 filter banks flattened, each also transposed (tall); not the largest, 256 x
# 2304, whose singular values after 3 steps (measured) lie inside the others', at 5 times the cost
FILTER_SHAPES = [(64, 24 * 9), (64, 64 * 9), (256, 64 * 9)]
COEFFICIENTS = {'airbench94_muon': (3.4445, -4.7750, 2.0315),
                'airbench94_hiverge': (3.4576, -4.7391, 2.0843)}
# Singular values after 3 steps, measured: muon bf16 0.669 to 1.205, fp32 0.682 to 1.202; hiverge
# bf16 0.793 to 1.247, fp32 0.793 to 1.240 (the record intends "roughly 0.5 to 1.5")
BANDS = {'airbench94_muon': (0.6, 1.25), 'airbench94_hiverge': (0.75, 1.3)}


def newton_schulz_by_svd(coefficients, matrix, steps):
    """The iteration on the singular values alone, in float64: independent of the code tested."""
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    a, b, c = coefficients
    s = s / s.square().sum().sqrt()
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return u @ torch.diag(s) @ vh


def random_filter_matrices():
    generator = torch.Generator().manual_seed(0)
    for rows, cols in FILTER_SHAPES:
        matrix = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
        yield matrix
        yield matrix.T


def orthogonalize(script, matrix, steps, dtype):
    """airbench94_hiverge's takes a batch, in its own dtype."""
    if script.__name__ == 'airbench94_hiverge':
        return script.orthogonalize(matrix[None].to(dtype), steps)[0]
    return script.orthogonalize(matrix, steps, dtype)


# tolerance: of the off-diagonal share of U^T X V (the input's singular vectors applied to the
# output), measured below 1e-6 in fp32, at most 0.016 in bf16 (its rounding)
@pytest.mark.parametrize('name', MUON_SCRIPTS)
@pytest.mark.parametrize('dtype, tolerance', [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_newton_schulz_puts_the_singular_values_in_the_band_and_keeps_the_vectors(name, dtype,
                                                                                   tolerance):
    script = load_script(name)
    low, high = BANDS[name]
    for matrix in random_filter_matrices():
        output = orthogonalize(script, matrix, 3, dtype).double()
        singular_values = torch.linalg.svdvals(output)
        assert singular_values.min() > low and singular_values.max() < high, matrix.shape
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
        rotated = u.T @ output @ vh.T
        off_diagonal = rotated - torch.diag(torch.diagonal(rotated))
        assert off_diagonal.norm() / rotated.norm() < tolerance, matrix.shape
    if dtype == torch.float32:
        expected = newton_schulz_by_svd(COEFFICIENTS[name], matrix, 3)
        assert torch.allclose(output, expected, atol=1e-4)
    # The control: one step leaves the small singular values below the band
    one_step = orthogonalize(script, matrix, 1, dtype).double()
    assert torch.linalg.svdvals(one_step).min() < low


@pytest.mark.parametrize('name', MUON_SCRIPTS)
def test_muon_step_is_renormalization_then_orthogonal_update_then_decoupled_decay(name):
    """Two banks of different shapes (airbench94_hiverge pads one to the other's) against each
    bank's update by SVD; airbench94_hiverge renormalizes where its flag says."""
    script = load_script(name)
    hiverge = name == 'airbench94_hiverge'
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 2, 3, 3), (6, 4, 3, 3)]
    weights = [nn.Parameter(torch.randn(shape, generator=generator, dtype=torch.float64))
               for shape in shapes]
    lr = 0.205
    momentum = 0.655
    decay = 1.0418e-6 * 1536 if hiverge else 0.0
    decoupled = (decay,) if hiverge else ()
    optimizer = script.Muon(weights, lr, momentum, 3, *decoupled, torch.float64)

    def step(renormalize):  # airbench94_hiverge's takes its flag
        optimizer.step(*([torch.tensor(renormalize)] if hiverge else []))
    expected = [w.detach().clone() for w in weights]
    buffers = [torch.zeros(shape, dtype=torch.float64) for shape in shapes]
    for renormalize in ((True, False, True) if hiverge else (True, True, True)):
        grads = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
        for weight, grad in zip(weights, grads):
            weight.grad = grad.clone()
        step(renormalize)
        for i, (grad, shape) in enumerate(zip(grads, shapes)):
            buffers[i] = momentum * buffers[i] + grad
            nesterov = grad + momentum * buffers[i]
            if renormalize:
                expected[i] = expected[i] * (shape[0]**0.5 / expected[i].norm())
            update = newton_schulz_by_svd(COEFFICIENTS[name], nesterov.flatten(1), 3)
            expected[i] = (expected[i] - lr * update.view(shape)) * (1 - lr * decay)
            # within the 1e-7 that the iteration adds to the norm it divides by: ~1e-9 here
            assert torch.allclose(weights[i].detach(), expected[i], atol=1e-8), (renormalize, i)
    assert abs(weights[0].norm().item() - 2.0) > 1e-3  # not renormalized at the last step alone
    weights[0].grad = None
    before = weights[0].detach().clone()
    weights[1].grad = torch.randn(shapes[1], generator=generator, dtype=torch.float64)
    step(False)
    assert torch.equal(weights[0].detach(), before)


@pytest.mark.parametrize('name', MUON_SCRIPTS)
def test_groups_cover_every_trainable_parameter_once_each_decaying_per_example(name):
    script = load_script(name)
    net = script.build_net({**script.hyp['net'], 'widths': TINY_WIDTHS}, 10, CPU, 'fp32')
    opt = script.hyp['opt']
    filters, sgd_groups = script.optimizer_groups(net, opt['bias_lr'], opt['head_lr'],
                                                  opt['weight_decay'], opt['batch_size'])
    grouped = [id(p) for p in filters] + [id(p) for g in sgd_groups for p in g['params']]
    assert sorted(grouped) == sorted(id(p) for p in net.parameters() if p.requires_grad)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert [id(p) for p in filters] == [id(m.weight) for m in convs] and len(filters) == 6
    whiten_bias, norm_biases, head = sgd_groups
    assert whiten_bias['params'] == [net[0].bias] and head['params'] == [net[-2].weight]
    assert whiten_bias['lr'] == norm_biases['lr'] == opt['bias_lr']
    assert head['lr'] == opt['head_lr']
    for group in sgd_groups:  # each step decays weight_decay per example, at the full lr
        assert group['lr'] * group['weight_decay'] == pytest.approx(
            opt['weight_decay'] * opt['batch_size'])


def test_hyperparameters_are_the_records(ab94):
    muon = load_script('airbench94_muon')
    opt = muon.hyp['opt']
    arch = muon.hyp['net']
    assert opt == dict(train_epochs=8, batch_size=2000, filter_lr=0.24, filter_momentum=0.6,
                       newton_schulz_steps=3, head_lr=0.67, bias_lr=0.053, momentum=0.85,
                       weight_decay=2e-6, label_smoothing=0.2, whiten_bias_epochs=3)
    assert muon.hyp['aug'] == ab94.hyp['aug']
    switches = ('whiten', 'identity_init')  # the paper's ablations, which the record does not have
    assert arch == {**{k: v for k, v in ab94.hyp['net'].items() if k not in switches},
                    'scaling_factor': 1 / 256, 'compile_mode': 'max-autotune'}  # as the record


@pytest.mark.parametrize('name', MUON_SCRIPTS)
def test_head_starts_at_unit_std_and_whitening_bias_keeps_its_init(name):
    script = load_script(name)
    torch.manual_seed(0)
    net = script.build_net({**script.hyp['net'], 'widths': TINY_WIDTHS}, 10, CPU, 'fp32')
    assert net[-2].weight.std().item() == pytest.approx(1.0)
    torch.manual_seed(1)
    script.reinitialize(net)
    assert net[-2].weight.std().item() == pytest.approx(1.0)
    bias = net[0].bias.detach().clone()
    assert bias.abs().max() > 0  # PyTorch's default init, not zeros
    script.init_whitening(net[0], torch.randn(50, 3, 32, 32), 5e-4)
    assert torch.equal(net[0].bias.detach(), bias)


# In batches of 16 of 64 images: the run's entries, its steps, the whitening bias's (whole epochs
# in airbench94_muon; in airbench94_hiverge the steps begun in its fraction of an epoch, 2 of 4),
# airbench94_hiverge's renormalizations (intervals 2, 3, 5, 8, 13)
SCHEDULES = {'airbench94_muon': ({'opt.train_epochs': 4, 'opt.whiten_bias_epochs': 2}, 16, 8,
                                 None),
             'airbench94_hiverge': ({'opt.train_epochs': 9.9, 'opt.whiten_bias_epochs': 0.4}, 40,
                                    2, [1, 4, 9, 17, 30])}


@pytest.mark.parametrize('name', MUON_SCRIPTS)
def test_schedules_decay_linearly_to_zero_and_the_whitening_bias_freezes(name, monkeypatch):
    """The whitening bias's lr decays over its own steps, after which it has no gradient."""
    script = load_script(name)
    entries, total, bias_steps, renormalized = SCHEDULES[name]
    assert script.lr_schedule(4) == [1.0, 0.75, 0.5, 0.25, 0.0]
    net = script.build_net({**script.hyp['net'], 'widths': TINY_WIDTHS}, 2, CPU, 'fp32')
    seen = []  # every step: Muon's lr and renormalization, whether the whitening bias has a grad
    sgd_lrs = []
    muon_step = script.Muon.step
    sgd_step = torch.optim.SGD.step

    def recording_muon_step(self, *renormalize):  # its lr and renormalize: tensors
        seen.append((self.param_groups[0]['lr'].item(), [r.item() for r in renormalize],
                     net[0].bias.grad is not None))
        return muon_step(self, *renormalize)

    def recording_sgd_step(self):
        sgd_lrs.append([group['lr'] for group in self.param_groups])
        return sgd_step(self)
    monkeypatch.setattr(script.Muon, 'step', recording_muon_step)
    monkeypatch.setattr(torch.optim.SGD, 'step', recording_sgd_step)
    hyp = with_entries(script.hyp, {'opt.batch_size': 16, **entries})
    result = script.train(tiny_dataset(), hyp, CPU, 'fp32', 0, net=net, epoch_eval=False)
    opt = hyp['opt']
    assert result['steps'] == total
    decay = [1 - step / total for step in range(total)]
    assert [lr for lr, _, _ in seen] == pytest.approx([opt['filter_lr'] * m for m in decay])
    assert [had_grad for _, _, had_grad in seen] == [True] * bias_steps + [False] * (
        total - bias_steps)
    assert [lrs[0] for lrs in sgd_lrs[:bias_steps]] == pytest.approx(
        [opt['bias_lr'] * (1 - step / bias_steps) for step in range(bias_steps)])
    assert [lrs[1] for lrs in sgd_lrs] == pytest.approx([opt['bias_lr'] * m for m in decay])
    assert [lrs[2] for lrs in sgd_lrs] == pytest.approx([opt['head_lr'] * m for m in decay])
    if renormalized is not None:
        assert [step for step, (_, flag, _) in enumerate(seen) if flag[0]] == renormalized


@pytest.mark.parametrize('name', MUON_SCRIPTS)
def test_cpu_path_eager_sgd_unfused_and_newton_schulz_in_bf16_or_fp32(name, monkeypatch):
    """The CPU path gives the results it gave before the CUDA path was compiled and fused."""
    script = load_script(name)
    sgds = spy(monkeypatch, torch.optim.SGD, '__init__')
    muons = spy(monkeypatch, script.Muon, '__init__')
    orthogonalized = spy(monkeypatch, script, 'orthogonalize')
    monkeypatch.setattr(torch, 'compile', lambda *args, **kwargs: pytest.fail('compiled on CPU'))
    hyp = with_entries(script.hyp, {**tiny_hyp(name), 'opt.train_epochs': 0.5, 'net.tta_level': 0})
    opt = hyp['opt']
    for precision, dtype in (('bf16', torch.bfloat16), ('fp32', torch.float32)):
        orthogonalized.clear()
        script.train(tiny_dataset(), hyp, CPU, precision, seed=0, epoch_eval=False)
        # (update, steps), or airbench94_muon's (update, steps, dtype)
        assert {args[2] if len(args) > 2 else args[0].dtype for args in orthogonalized} == {dtype}
        muon = muons[-1][0]
        group = muon.param_groups[0]
        assert (group['lr'], group['momentum'], group['steps'], group['dtype']) == (
            opt['filter_lr'], opt['filter_momentum'], opt['newton_schulz_steps'], dtype)
        assert group.get('weight_decay', 0) == pytest.approx(
            opt['weight_decay'] * 32 if 'renorm_every' in opt else 0)
        assert muon.update is script.muon_update
    assert [sgd.defaults['fused'] for sgd, *_ in sgds] == [False, False]


@pytest.mark.slow  # inductor's CPU backend runs a C++ compiler
def test_compiled_muon_step_computes_what_the_eager_one_does():
    """At two lrs, tensors as train() gives them."""
    muon = load_script('airbench94_muon')
    torch._dynamo.reset()
    net = muon.build_net(muon.hyp['net'], 10, CPU, 'fp32')
    filters = [p for p in net.parameters() if p.ndim == 4 and p.requires_grad]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=generator) for p in filters]
    results = []
    for compiled in (True, False):
        weights = [nn.Parameter(p.detach().clone()) for p in filters]
        optimizer = muon.Muon(weights, 0.24, 0.6, 3, torch.float32, compiled=compiled)
        for lr in (0.24, 0.12):
            optimizer.param_groups[0]['lr'] = torch.tensor(lr)
            for weight, grad in zip(weights, grads):
                weight.grad = grad.clone()
            optimizer.step()
        results.append(weights)
    for compiled, eager in zip(*results):
        assert torch.allclose(compiled, eager, atol=1e-5)
