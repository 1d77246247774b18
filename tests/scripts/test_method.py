"""Properties of the method, each of which a broken implementation fails: the shared blocks on
airbench94 (test_layout.py proves them identical), the networks and train() on each script."""
import ast
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import (ALL_SCRIPTS, CPU, PAPER_SCRIPTS, TINY_WIDTHS, load_script, marked_slow,
                      quick_train, script_changes, tiny_dataset, tiny_hyp)
from studylib.hyp import with_entries

# All parameters, the frozen whitening weights and BatchNorm scales included; the paper states
# 1.97 M for airbench94
PARAMETER_COUNTS = {'airbench94': 1_972_792, 'airbench94_compiled': 1_972_792,
                    'airbench95': 4_606_520, 'airbench96': 12_721_208,
                    'airbench94_muon': 1_972_792, 'airbench94_hiverge': 1_972_792,
                    'airbench96_faster': 9_918_776}


@pytest.fixture(scope='module', params=ALL_SCRIPTS)
def script_and_net(request):
    """Each script with its full network, built once."""
    script = load_script(request.param)
    arch = script.hyp['net']
    torch.manual_seed(0)
    return script, script.make_net(arch['widths'], 10, arch['batchnorm_momentum'],
                                   arch['scaling_factor'])


def test_shapes_parameter_count_and_biases(script_and_net):
    script, net = script_and_net
    sizes = []
    hooks = [module.register_forward_hook(lambda m, i, o: sizes.append(o.shape[-1]))
             for module in [net[1], *net[2:5]]]  # whitening GELU, then the three blocks
    out = net(torch.randn(2, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    assert sizes == [31, 15, 7, 3] and out.shape == (2, 10)
    count = sum(p.numel() for p in net.parameters())
    assert count == PARAMETER_COUNTS[script.__name__]
    assert f'{count:,}' in script.__doc__  # the header states the built network's count
    convs = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert convs[0].bias is not None and all(m.bias is None for m in convs[1:])
    assert not net[0].weight.requires_grad


def test_batchnorm_as_specified(script_and_net):
    script, net = script_and_net
    norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    momentum = script.hyp['net']['batchnorm_momentum']
    for norm in norms:
        assert norm.eps == 1e-12
        assert norm.momentum == pytest.approx(1 - momentum)  # PyTorch's sense of the word
        assert not norm.weight.requires_grad and norm.bias.requires_grad
        assert torch.all(norm.weight == 1)
    # The running mean follows momentum * old + (1 - momentum) * batch mean
    norm = norms[0]
    norm.train()
    x = torch.randn(8, norm.num_features, 4, 4) + 3
    norm.running_mean.fill_(1.0)
    norm(x)
    assert torch.allclose(norm.running_mean, momentum * 1.0 + (1 - momentum) * x.mean((0, 2, 3)),
                          atol=1e-5)


def test_identity_init(script_and_net):
    _, net = script_and_net
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) >= 6
    for conv in convs:
        m = conv.in_channels
        x = torch.randn(2, m, 9, 9)
        assert torch.allclose(conv(x)[:, :m], x, atol=1e-6)
        if conv.out_channels > m:  # the rest keep PyTorch's default init: not zeros, not identity
            rest = conv.weight[m:]
            bound = 1 / math.sqrt(m * 9)
            assert rest.abs().max() <= bound and rest.std() > 0.3 * bound


@pytest.mark.parametrize('pad', [2, 4])
def test_translation_is_a_uniform_crop_of_the_reflect_padded_image_within_pad(ab94, pad):
    """The loader's epoch, of 8x8 images: the code does not depend on the size."""
    torch.manual_seed(0)
    n = 3000
    images = torch.randint(0, 256, (n, 8, 8, 3), dtype=torch.uint8)
    loader = ab94.CifarLoader(images, torch.arange(n), n, (0.0,) * 3, (1.0,) * 3,
                              {'flip': 'none', 'translate': pad, 'cutout': 0})
    crops = loader.augmented_epoch()
    padded = F.pad(images.permute(0, 3, 1, 2).float() / 255, (pad,) * 4, mode='reflect')
    windows = padded.unfold(2, 8, 1).unfold(3, 8, 1)  # n, 3, 2p+1, 2p+1, 8, 8
    # Each crop's first channel is exactly one window's, and the crop that window whole
    matches = (windows[:, 0] == crops[:, 0, None, None]).flatten(3).all(-1)  # n, 2p+1, 2p+1
    assert torch.all(matches.flatten(1).sum(1) == 1)
    shifts = matches.flatten(1).int().argmax(1)
    assert torch.equal(windows[torch.arange(n), :, shifts // (2 * pad + 1),
                               shifts % (2 * pad + 1)], crops)
    counts = matches.sum(0).float()  # shifts -pad..pad in each direction
    assert torch.all(counts > 0)  # every shift within +-pad occurs (and no other is possible)
    expected = n / (2 * pad + 1)  # each axis uniform: binomial sd < 5% of expected here
    for marginal in (counts.sum(0), counts.sum(1)):
        assert marginal.min() > 0.8 * expected and marginal.max() < 1.2 * expected


def test_cutout_zeroes_one_square_inside_the_image_at_a_uniform_position(ab94):
    """On images wider than high, so that rows and columns each have their own range."""
    torch.manual_seed(0)
    n = 4000
    size = 6
    images = torch.rand(n, 3, 16, 24) + 0.5  # no zeros before cutout
    out = ab94.batch_cutout(images, size)
    zero = (out == 0)
    assert torch.all(zero.all(1) == zero.any(1))  # all channels at once
    zero = zero[:, 0]
    rows = zero.any(2)
    cols = zero.any(1)
    assert torch.all(zero.flatten(1).sum(1) == size * size)
    assert torch.all(rows.sum(1) == size) and torch.all(cols.sum(1) == size)  # one square
    kept = ~zero.unsqueeze(1).expand_as(out)
    assert torch.all(out[kept] == images[kept])
    for lines, length in ((rows, 16), (cols, 24)):
        counts = torch.bincount(lines.float().argmax(1), minlength=length - size + 1).float()
        assert len(counts) == length - size + 1  # every position inside, none outside
        expected = n / (length - size + 1)
        assert counts.min() > 0.6 * expected and counts.max() < 1.4 * expected


def test_whitening_layer_is_w_and_minus_w_and_whitens_patches(ab94):
    torch.manual_seed(0)
    # Correlated channels and neighbours: work for the whitening
    mixing = torch.tensor([[1.0, 0.8, 0.3], [0.0, 0.6, 0.5], [0.0, 0.0, 0.4]])
    images = torch.einsum('nchw,cd->ndhw', torch.randn(500, 3, 32, 32), mixing)
    images = images + 0.5 * images.roll(1, dims=-1)
    layer = nn.Conv2d(3, 24, 2, padding=0, bias=True)
    eps = 5e-4
    ab94.init_whitening(layer, images, eps)
    weight = layer.weight.detach()
    assert torch.equal(weight[12:], -weight[:12])
    assert torch.all(layer.bias == 0)
    patches = images.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)
    second_moment = patches.T @ patches / len(patches)
    eigenvalues = torch.linalg.eigvalsh(second_moment).flip(0)
    filters = weight[:12].reshape(12, 12)
    whitened = filters @ second_moment @ filters.T
    # Exactly diag(l / (l + eps)): the identity up to eps, largest eigenvalue first
    assert torch.allclose(whitened, torch.diag(eigenvalues / (eigenvalues + eps)), atol=1e-4)
    assert torch.allclose(whitened, torch.eye(12), atol=eps / eigenvalues.min().item() + 1e-4)
    variances = (filters * filters).sum(1)  # 1 / (l + eps): increasing when l is decreasing
    assert torch.all(variances[1:] >= variances[:-1])


def test_lookahead_arithmetic_and_decay(ab94):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    lookahead = ab94.LookaheadState(net)
    slow = {k: v.clone() for k, v in lookahead.slow.items()}
    assert set(slow) == {'0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean',
                         '1.running_var'}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    net.train()
    net(torch.randn(16, 3))  # changes the running statistics and num_batches_tracked
    live = {k: v.clone() for k, v in net.state_dict().items()}
    decay = 0.7
    lookahead.update(net, decay)
    for name, value in net.state_dict().items():
        if name in slow:
            expected = decay * slow[name] + (1 - decay) * live[name]
            assert torch.allclose(value, expected, atol=1e-6), name
            assert torch.allclose(lookahead.slow[name], expected, atol=1e-6), name
        else:
            assert torch.equal(value, live[name])  # integer counters are left alone
    before = {k: v.clone() for k, v in lookahead.slow.items()}
    lookahead.update(net, 1.0)  # the end of training: the live model becomes the slow copy
    for name in before:
        assert torch.equal(net.state_dict()[name], before[name])
    decays = [ab94.lookahead_decay(step, 100) for step in (0, 50, 100)]
    assert decays == pytest.approx([0, 0.95**5 / 8, 0.95**5])


@pytest.mark.parametrize('total, options, peak, end', [
    (476, {}, 109, 0.07),  # airbench94's 48 steps an epoch for 9.9 epochs; int(0.23 * 476)
    (2160, {'peak_fraction': 0.1, 'end': 0.0}, 216, 0.0)])  # airbench96_faster's, this block
def test_lr_schedule_rises_linearly_from_0_2_to_1_then_falls_to_its_end(ab94, total, options,
                                                                         peak, end):
    multipliers = ab94.lr_schedule(total, **options)
    steps = torch.arange(total + 1, dtype=torch.float64)
    expected = torch.where(steps < peak, 0.2 + 0.8 * steps / peak,
                           1 + (end - 1) * (steps - peak) / (total - peak))
    assert torch.allclose(multipliers, expected, atol=1e-12)
    assert multipliers[[0, peak, total]].tolist() == pytest.approx([0.2, 1.0, end])


@pytest.mark.parametrize('name', marked_slow(PAPER_SCRIPTS[1:], PAPER_SCRIPTS))
def test_decoupled_lr_and_weight_decay(name):
    script = load_script(name)
    net = script.make_net(TINY_WIDTHS, 10, 0.6, 1 / 9)
    groups = script.decoupled_sgd_groups(net, lr=11.5, weight_decay=0.0153, momentum=0.85,
                                         batch_size=1024, bias_scaler=64.0)
    kilostep = 1024 * (1 + 1 / (1 - 0.85))
    norm_biases, others = groups
    assert others['lr'] == pytest.approx(11.5 / kilostep)
    assert norm_biases['lr'] == pytest.approx(64 * 11.5 / kilostep)
    for group in groups:  # the same decay strength in every group, whatever its lr
        assert group['lr'] * group['weight_decay'] == pytest.approx(0.0153 * 1024 / kilostep)
    # Every trainable parameter is in exactly one group; frozen ones in none
    grouped = [id(p) for g in groups for p in g['params']]
    assert sorted(grouped) == sorted(id(p) for p in net.parameters() if p.requires_grad)
    norm_bias_ids = {id(m.bias) for m in net.modules() if isinstance(m, nn.BatchNorm2d)}
    assert {id(p) for p in norm_biases['params']} == norm_bias_ids
    assert id(net[0].bias) in {id(p) for p in others['params']}
    # The same decay per step whatever the lr
    other_lr = script.decoupled_sgd_groups(net, lr=5.0, weight_decay=0.0153, momentum=0.85,
                                           batch_size=1024, bias_scaler=64.0)
    assert other_lr[1]['lr'] * other_lr[1]['weight_decay'] == pytest.approx(
        others['lr'] * others['weight_decay'])


def test_tta_levels_are_the_weighted_means_of_the_views(ab94):
    torch.manual_seed(0)
    # Position- and orientation-sensitive: every view gives different logits
    net = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Tanh(), nn.Flatten(), nn.Linear(5 * 30 * 30, 4))
    images = torch.randn(10, 3, 32, 32)
    autocast = torch.autocast('cpu', enabled=False)
    padded = F.pad(images, (1,) * 4, mode='reflect')
    up_left = padded[:, :, 0:32, 0:32]
    down_right = padded[:, :, 2:34, 2:34]
    with torch.no_grad():
        views = [net(v) for v in (images, images.flip(-1), up_left, up_left.flip(-1),
                                  down_right, down_right.flip(-1))]
    expected = {0: views[0], 1: (views[0] + views[1]) / 2,
                2: (views[0] + views[1]) / 4 + (views[2] + views[3] + views[4] + views[5]) / 8}
    for level, logits in expected.items():
        got = ab94.infer(net, images, level, autocast, batch_size=4)  # batches of 4, 4, 2
        assert torch.allclose(got, logits, atol=1e-5), level
    assert not torch.allclose(expected[2], expected[1], atol=1e-3)  # the views do differ


def test_airbench96_block_output_is_its_two_paths_summed():
    script = load_script('airbench96')
    torch.manual_seed(0)
    block = script.ConvGroup(8, 16, 0.6).eval()
    for norm in (block.norm1, block.norm2, block.norm3):  # non-trivial statistics and biases
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        norm.bias.data.uniform_(-1, 1)
    x = torch.randn(3, 8, 14, 14)
    shortcut = block.activ(block.norm1(block.pool(block.conv1(x))))
    branch = block.activ(block.norm3(block.conv3(block.activ(block.norm2(block.conv2(shortcut))))))
    with torch.no_grad():
        assert torch.allclose(block(x), shortcut + branch, atol=1e-6)
        assert not torch.allclose(block(x), branch, atol=1e-3)  # the shortcut does contribute
    assert sum(isinstance(m, nn.Conv2d) for m in block.modules()) == 3


def test_airbench94_hyperparameters_are_the_papers(ab94):
    assert ab94.hyp == dict(
        opt=dict(train_epochs=9.9, batch_size=1024, sampling='reshuffle', lr=11.5, momentum=0.85,
                 weight_decay=0.0153, bias_scaler=64.0, label_smoothing=0.2,
                 whiten_bias_epochs=3, lookahead_every=5),
        aug=dict(flip='alternating', translate=2, cutout=0),
        net=dict(widths={'block1': 64, 'block2': 256, 'block3': 256}, batchnorm_momentum=0.6,
                 scaling_factor=1 / 9, whiten=True, whiten_eps=5e-4, identity_init=True,
                 tta_level=2))


def documented_hyp_changes(name):
    """docs/layout.md's table of a paper script's hyp entries: {(group, key): (airbench94's value,
    the script's)}, widths written block1/block2/block3."""
    if name == 'airbench94':
        return {}

    def value(cell):
        if cell == 'absent':  # an entry airbench94 has not
            return cell
        if '/' in cell:
            return {f'block{i}': int(width) for i, width in enumerate(cell.split('/'), 1)}
        return ast.literal_eval(cell)

    rows = re.findall(r'^\| `(\w+)\.(\w+)` \| ([^|]+) \| ([^|]+) \|$', script_changes(name),
                      re.MULTILINE)
    return {(group, key): (value(before.strip()), value(after.strip()))
            for group, key, before, after in rows}


def test_hyperparameters_differ_from_airbench94_only_as_docs_layout_says(paper_script, ab94):
    differences = {(group, key): (ab94.hyp[group].get(key, 'absent'), value)
                   for group in paper_script.hyp for key, value in paper_script.hyp[group].items()
                   if ab94.hyp[group].get(key, 'absent') != value}
    assert differences == documented_hyp_changes(paper_script.__name__)
    assert all(group in ab94.hyp and set(keys) >= set(ab94.hyp[group])
               for group, keys in paper_script.hyp.items())


# airbench95's train() and network are airbench94's (test_layout.py), airbench96's but its block
@pytest.mark.parametrize('name', marked_slow(['airbench95', 'airbench96']))
def test_the_same_seed_trains_bitwise_alike_another_differs(name, monkeypatch):
    """To the last bit, also on a network already trained (a study builds its network once; this
    one's whitening bias ended frozen). airbench94_compiled uncompiled (on a CPU: inductor)."""
    monkeypatch.setattr(torch, 'compile', lambda function, **kwargs: function)
    script = load_script(name)
    data = tiny_dataset()
    entries = {**tiny_hyp(name), 'opt.train_epochs': 2, 'opt.whiten_bias_epochs': 1,
               'net.tta_level': 1}
    fresh = quick_train(script, data, seed=3, entries=entries)
    assert not fresh['net'][0].bias.requires_grad  # frozen after 1 epoch of 2
    again = quick_train(script, data, seed=3, net=fresh['net'], entries=entries)
    other = quick_train(script, data, seed=4, entries=entries)
    figures = ('epoch_train_losses', 'tta_val_acc', 'steps')
    assert [again[key] for key in figures] == [fresh[key] for key in figures]
    assert other['epoch_train_losses'] != fresh['epoch_train_losses']


def test_on_epoch_gets_each_epochs_figures_and_can_stop_the_run(ab94):
    hyp = with_entries(ab94.hyp, {'opt.batch_size': 32, 'opt.train_epochs': 2.5,  # 2 steps an epoch
                                  'net.widths': TINY_WIDTHS, 'net.tta_level': 0})
    seen = []
    result = ab94.train(tiny_dataset(), hyp, CPU, 'fp32', 0, on_epoch=seen.append)
    assert [f['epoch'] for f in seen] == [0, 1, 2] and result['steps'] == 5  # ceil(2 * 2.5)
    assert [f['train_loss'] for f in seen] == result['epoch_train_losses']
    assert all(0 <= f['val_acc'] <= 1 and 0 <= f['train_acc'] <= 1 for f in seen)
    times = [f['total_time_seconds'] for f in seen] + [result['total_time_seconds']]
    assert all(a < b for a, b in zip(times, times[1:]))  # the timed seconds only accumulate
    with pytest.raises(ZeroDivisionError):  # on_epoch stops the run
        ab94.train(tiny_dataset(), hyp, CPU, 'fp32', 0, on_epoch=lambda figures: 1 / 0)


def test_each_source_of_randomness_has_its_own_seed(ab94):
    seeds = ab94.source_seeds(0)
    assert set(seeds) == {'init', 'order', 'aug'} and len(set(seeds.values())) == 3
    assert ab94.source_seeds(0) == seeds and ab94.source_seeds(1) != seeds

    def run(entries, **changes):
        result = quick_train(ab94, tiny_dataset(), {**seeds, **changes}, entries={
            'opt.batch_size': 16, 'opt.train_epochs': 1, 'net.tta_level': 0, **entries})
        # block2's first conv: 8 identity filters, 8 at PyTorch's random init
        return result['net'][3].conv1.weight.detach().clone(), result['epoch_train_losses']

    # With a vanishing lr the filters stay as initialized (the zeros of the identity init move by
    # ~1e-35, the run's 4 steps being too few for Lookahead): only the init seed may change them
    frozen = {'opt.lr': 1e-30, 'opt.weight_decay': 0.0}
    weights, _ = run(frozen)
    assert torch.allclose(run(frozen, order=7, aug=8)[0], weights, rtol=0, atol=1e-30)
    assert (run(frozen, init=7)[0] - weights).abs().max() > 1e-3
    # Without augmentation the aug seed changes nothing; the order seed changes the batches
    plain = {'aug.flip': 'none', 'aug.translate': 0}
    weights, losses = run(plain)
    assert torch.equal(run(plain, aug=8)[0], weights)
    assert run(plain, order=7)[1] != losses
    # With augmentation the aug seed matters
    assert run({})[1] != run({}, aug=8)[1]
