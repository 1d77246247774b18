"""The switches in hyp for the features the paper ablates: each non-default value changes the
training as its name says, seen in what train() does (its optimizer's steps, its loader's batches,
its calls). train() is airbench94's in the paper's four scripts (test_layout.py)."""
import copy
import itertools
import math

import pytest
import torch
from torch import nn

from conftest import (CPU, PAPER_SCRIPTS, TINY_WIDTHS, load_script, marked_slow, quick_train,
                      spy, study_hyp, tiny_dataset)
from studylib.hyp import with_entries

N = 2050  # loader tests: 20 full batches of BATCH and a partial one, dropped
BATCH = 100


class RecordingSGD(torch.optim.SGD):
    """Keeps its initial lrs and its parameters before its first step and after its last."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial_lrs = [group['lr'] for group in self.param_groups]
        self.first = None
        RecordingSGD.latest = self

    def params(self):
        return [p for group in self.param_groups for p in group['params']]

    def step(self, closure=None):
        if self.first is None:
            self.first = [p.detach().clone() for p in self.params()]
        result = super().step(closure)
        self.last = [p.detach().clone() for p in self.params()]
        return result


@pytest.fixture
def sgd(monkeypatch):
    monkeypatch.setattr(torch.optim, 'SGD', RecordingSGD)
    return RecordingSGD


def index_of(tensor, tensors):
    return next(i for i, t in enumerate(tensors) if t is tensor)


def run(script, seed=0, net=None, entries=None):
    """quick_train for 3 epochs of 2 steps, without TTA (these switches act on training)."""
    return quick_train(script, tiny_dataset(), seed, net,
                       {'opt.train_epochs': 3, 'net.tta_level': 0, **(entries or {})})


def test_whitening_off_trains_the_first_conv_from_its_default_init(ab94, sgd, monkeypatch):
    whitenings = spy(monkeypatch, ab94, 'init_whitening')
    conv = run(ab94, 2, entries={'net.whiten': False, 'opt.whiten_bias_epochs': 1})['net'][0]
    assert whitenings == []
    assert conv.weight.requires_grad and conv.bias.requires_grad  # all 3 epochs, not the first
    params = sgd.latest.params()
    first = sgd.latest.first[index_of(conv.weight, params)]
    last = sgd.latest.last[index_of(conv.weight, params)]
    assert first.abs().max() <= 1 / math.sqrt(12) and first.std() > 0.1  # PyTorch's default init
    images = tiny_dataset()['train']['images'].permute(0, 3, 1, 2).float() / 255
    filters = ab94.whitening_filters((images - 0.5) / 0.25, 2, ab94.hyp['net']['whiten_eps'])
    assert not torch.allclose(first, torch.cat([filters, -filters]), atol=0.1)
    assert (last - first).abs().max() > 1e-3  # trained
    bias_index = index_of(conv.bias, params)
    assert not torch.equal(sgd.latest.last[bias_index], sgd.latest.first[bias_index])
    # The control: with whitening, the weights are the whitening filters, never trained
    conv = run(ab94, 2, entries={'opt.whiten_bias_epochs': 1})['net'][0]
    assert len(whitenings) == 1
    assert not conv.weight.requires_grad and not conv.bias.requires_grad  # frozen after 1 epoch
    assert all(p is not conv.weight for p in sgd.latest.params())
    assert torch.allclose(conv.weight, torch.cat([filters, -filters]), atol=1e-4)


@pytest.mark.parametrize('name', marked_slow(['airbench94_compiled', 'airbench95'], PAPER_SCRIPTS))
def test_identity_init_off_leaves_the_3x3_convs_at_their_default_init(name):
    script = load_script(name)
    nets = {}
    for identity_init in (True, False):
        nets[identity_init] = script.make_net(TINY_WIDTHS, 10, 0.6, 1 / 9)
        torch.manual_seed(0)  # the same init seed
        script.reinitialize(nets[identity_init], identity_init=identity_init)
    pairs = [(on, off) for on, off in zip(nets[True].modules(), nets[False].modules())
             if isinstance(on, nn.Conv2d) and on.kernel_size == (3, 3)]
    assert len(pairs) >= 6
    for on, off in pairs:
        m = on.in_channels
        dirac = nn.init.dirac_(torch.empty_like(on.weight[:m]))
        assert torch.equal(on.weight[:m], dirac)
        assert not (off.weight[:m] == dirac).flatten(1).all(1).any()  # no identity filter at all
        assert off.weight.abs().max() <= 1 / math.sqrt(9 * m)  # PyTorch's default init
        assert torch.equal(on.weight[m:], off.weight[m:])  # elsewhere the same default init


def test_identity_init_off_in_training(ab94, monkeypatch):
    calls = spy(monkeypatch, ab94, 'init_identity')
    net = ab94.build_net({**ab94.hyp['net'], 'widths': TINY_WIDTHS}, 2, CPU, 'fp32')
    calls.clear()  # make_net's own init
    run(ab94, net=net, entries={'net.identity_init': False, 'opt.train_epochs': 1})
    assert calls == []
    run(ab94, net=net, entries={'opt.train_epochs': 1})
    assert len(calls) == 1


@pytest.mark.parametrize('scaler', [64.0, 1.0])
def test_bias_scaler_sets_the_batchnorm_bias_lr(ab94, sgd, scaler):
    net = run(ab94, entries={'opt.bias_scaler': scaler, 'opt.train_epochs': 1})['net']
    norm_biases, others = sgd.latest.param_groups
    assert {id(p) for p in norm_biases['params']} == {
        id(m.bias) for m in net.modules() if isinstance(m, nn.BatchNorm2d)}
    assert sgd.latest.initial_lrs[0] == pytest.approx(scaler * sgd.latest.initial_lrs[1], rel=1e-12)
    assert norm_biases['lr'] * norm_biases['weight_decay'] == pytest.approx(
        others['lr'] * others['weight_decay'])  # the same decay strength either way


def test_lookahead_off_returns_the_weights_of_the_last_step(ab94, sgd, monkeypatch):
    made = spy(monkeypatch, ab94, 'LookaheadState')
    off = run(ab94, 1, entries={'opt.lookahead_every': 0})
    assert made == [] and off['steps'] == 6
    params = sgd.latest.params()
    assert all(torch.equal(p, last) for p, last in zip(params, sgd.latest.last))
    assert any(not torch.equal(p, first) for p, first in zip(params, sgd.latest.first))
    # Lookahead that would never fire (every 7 of 6 steps) is off: its end would restore the start
    never = run(ab94, 1, entries={'opt.lookahead_every': 7})
    assert made == [] and never['epoch_train_losses'] == off['epoch_train_losses']
    for (name, a), b in zip(never['net'].state_dict().items(), off['net'].state_dict().values()):
        assert torch.equal(a, b), name
    # The control: Lookahead (every 5 steps) ends on its slow copy, not the last step's weights
    on = run(ab94, 1)
    assert len(made) == 1
    params = sgd.latest.params()
    assert not all(torch.equal(p, last) for p, last in zip(params, sgd.latest.last))
    assert on['epoch_train_losses'][:2] == off['epoch_train_losses'][:2]  # before its first update
    assert on['epoch_train_losses'][2] != off['epoch_train_losses'][2]


def loader_epochs(script, sampling, flip='none', epochs=3, order_seed=0, aug_seed=1):
    """Each epoch's ids in the order drawn and {id: mirrored}, of N images labelled by their index
    (airbench96_faster's one stream cut into epochs of N)."""
    images = torch.zeros(N, 4, 4, 3, dtype=torch.uint8)
    images[:, :, :2] = 255
    loader = script.CifarLoader(images, torch.arange(N), BATCH, (0.5,) * 3, (0.5,) * 3,
                                {'flip': flip, 'translate': 0, 'cutout': 0},
                                order_generator=torch.Generator().manual_seed(order_seed),
                                aug_generator=torch.Generator().manual_seed(aug_seed),
                                sampling=sampling)
    endless = script.__name__ == 'airbench96_faster'
    size = N if endless else len(loader) * BATCH
    stream = itertools.chain.from_iterable([loader] if endless else [loader] * epochs)
    batches = list(itertools.islice(stream, math.ceil(epochs * size / BATCH)))
    ids = torch.cat([labels for _, labels in batches])
    flipped = torch.cat([batch[:, 0, 0, 0] < 0 for batch, _ in batches])
    result = []
    for epoch in range(epochs):
        mirrored = {}
        for i, mirror in zip(ids[epoch * size:(epoch + 1) * size].tolist(),
                             flipped[epoch * size:(epoch + 1) * size].tolist()):
            assert mirrored.setdefault(i, mirror) == mirror  # one orientation per epoch
        result.append((ids[epoch * size:(epoch + 1) * size], mirrored))
    return result


def test_sampling_with_replacement_repeats_images_drawn_from_the_order_generator(ab94):
    for sampling in ('reshuffle', 'replacement'):
        previous = None
        for ids, _ in loader_epochs(ab94, sampling):
            assert len(ids) == N // BATCH * BATCH  # full batches: the partial one dropped
            counts = torch.bincount(ids, minlength=N)
            if sampling == 'reshuffle':
                assert counts.max() == 1  # a permutation, less the partial batch
            else:  # N draws with replacement: 1 - (1 - 1/N)**N ~ 63% distinct (sd 1%)
                assert counts.max() >= 2 and 0.6 < (counts > 0).float().mean() < 0.665
            assert previous is None or not torch.equal(counts, previous)  # drawn anew each epoch
            previous = counts
    reference = [ids for ids, _ in loader_epochs(ab94, 'replacement', 'random', 2)]
    for seeds, same in (({'aug_seed': 5}, True), ({'order_seed': 4}, False)):
        order = [ids for ids, _ in loader_epochs(ab94, 'replacement', 'random', 2, **seeds)]
        assert [torch.equal(a, b) for a, b in zip(order, reference)] == [same, same]


@pytest.mark.parametrize('name, sampling, flip', [
    ('airbench94', 'reshuffle', 'alternating'), ('airbench94', 'replacement', 'alternating'),
    ('airbench96_faster', 'reshuffle', 'alternating'), ('airbench94', 'reshuffle', 'random')])
def test_alternating_flip_alternates_each_images_orientation(name, sampling, flip):
    """Also with replacement, and along airbench96_faster's stream; the control: random flip, a
    coin per image and epoch, keeps about half the orientations."""
    epochs = [mirrored for _, mirrored in loader_epochs(load_script(name), sampling, flip, 4)]
    assert 0.45 < sum(epochs[0].values()) / len(epochs[0]) < 0.55
    for gap in (1, 2, 3):
        for earlier, later in zip(epochs, epochs[gap:]):
            common = earlier.keys() & later.keys()
            same = [earlier[i] == later[i] for i in common]
            assert len(common) > N / 4
            if flip == 'random':
                assert 0.45 < sum(same) / len(same) < 0.55
            else:
                assert all(kept == (gap % 2 == 0) for kept in same)


def test_training_samples_as_hyp_says(ab94, monkeypatch):
    """The loader's sampling, tested above, is hyp's."""
    loaders = spy(monkeypatch, ab94.CifarLoader, '__init__')
    for sampling in ('reshuffle', 'replacement'):
        run(ab94, entries={'opt.sampling': sampling, 'opt.train_epochs': 1})
        assert loaders[-1][0].sampling == sampling


def test_validation_checks_only_the_keys_a_scripts_hyp_has(ab94):
    """A script without some switch that the rules name (airbench94_muon: Lookahead) still runs."""
    bare = copy.deepcopy(ab94.hyp)
    for group, key in (('opt', 'sampling'), ('opt', 'lookahead_every'), ('net', 'whiten'),
                       ('net', 'identity_init')):
        del bare[group][key]
    assert study_hyp(ab94, [], hyp=bare) == bare


def test_airbench94_hiverges_switches_tta_fraction_and_jitter(monkeypatch):
    """net.tta_fraction 0 is plain evaluation; aug.brightness and aug.contrast 0, no jitter."""
    hiverge = load_script('airbench94_hiverge')
    epochs = spy(monkeypatch, hiverge, 'augmented_images')  # each epoch's augmentation
    net = hiverge.build_net({**hiverge.hyp['net'], 'widths': TINY_WIDTHS}, 2, CPU, 'fp32')
    evaluated = []  # images per forward pass in evaluation mode
    net.register_forward_pre_hook(lambda m, inputs: None if m.training else evaluated.append(
        len(inputs[0])))
    for settings, jittered in (([], True), (['net.tta_fraction=0', 'aug.brightness=0',
                                             'aug.contrast=0'], False)):
        run_hyp = study_hyp(hiverge, settings)
        epochs.clear()
        evaluated.clear()
        run_hyp = with_entries(run_hyp, {'opt.batch_size': 32, 'opt.train_epochs': 2})
        hiverge.train(tiny_dataset(), run_hyp, CPU, 'fp32', 0, net=net, epoch_eval=False)
        brightness_draws = [args[4] for args in epochs]  # a draw per image, or none
        assert len(epochs) == 2 and all((draws is not None) == jittered
                                        for draws in brightness_draws)
        # 64 test images once, then the six views of the least confident 16, or nothing more
        assert evaluated == ([64, 6 * 16] if jittered else [64])
