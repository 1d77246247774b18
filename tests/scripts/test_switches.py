"""The switches in hyp for the features the paper ablates (its additive-ablation figure and its
training-distribution table): each non-default value changes the training as its name says.

Training runs spy on what train() does (the optimizer's steps, the loader's batches, the calls it
makes) rather than trusting that a run finished. The shared method blocks are identical in the
paper's four scripts (test_layout.py), so train() is exercised on airbench94 alone."""
import copy
import itertools
import math
import re

import pytest
import torch
from torch import nn

from conftest import ALL_SCRIPTS, CPU, TINY_WIDTHS, load_script, quick_train, tiny_dataset
from studylib.cli import parse_flags
from studylib.errors import StudyError
from studylib.hyp import config_hyp, with_entries


def study_hyp(script, settings, hyp=None):
    """The hyp that study.py trains for `-- --hyp SETTING ...`, checked by the script's rules."""
    flags = [word for setting in settings for word in ('--hyp', setting)]
    return config_hyp(script.hyp if hyp is None else hyp, script.HYP_CHOICES, script.HYP_RANGES,
                      parse_flags(flags))

N = 2050  # loader tests: 20 full batches of BATCH and a partial one, dropped
BATCH = 100


class RecordingSGD(torch.optim.SGD):
    """torch.optim.SGD that keeps its initial lrs and its parameters before its first step and
    after its last; the latest one made is RecordingSGD.latest."""

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


def spy(monkeypatch, module, name):
    """Calls of module.name (each call's arguments), which still does its work."""
    calls = []
    original = getattr(module, name)

    def recorded(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, recorded)
    return calls


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


def test_identity_init_off_leaves_the_3x3_convs_at_their_default_init(paper_script):
    arch = paper_script.hyp['net']
    nets = {}
    for identity_init in (True, False):
        nets[identity_init] = paper_script.make_net(arch['widths'], 10, arch['batchnorm_momentum'],
                                                    arch['scaling_factor'])
        torch.manual_seed(0)  # the same init seed
        paper_script.reinitialize(nets[identity_init], identity_init=identity_init)
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
    net = ab94.build_net({**ab94.hyp['net'], 'widths': TINY_WIDTHS}, 2, torch.device('cpu'),
                         'fp32')
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
    # Lookahead that would never fire (every 7 of 6 steps) is off: its end would restore the
    # initial weights
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
    """Each epoch's ids in the order drawn, and each id's orientation in it (True: mirrored), of a
    loader in batches of BATCH over N images whose left half is +1 and right half -1, labelled by
    their index: an iteration per epoch, or airbench96_faster's one stream cut into epochs of N."""
    images = torch.zeros(N, 32, 32, 3, dtype=torch.uint8)
    images[:, :, :16] = 255
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


def test_sampling_with_replacement_repeats_images_within_an_epoch(ab94):
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


def test_sampling_with_replacement_draws_from_the_order_generator(ab94):
    def order(**seeds):
        return [ids for ids, _ in loader_epochs(ab94, 'replacement', 'random', 2, **seeds)]
    reference = order(order_seed=0, aug_seed=1)
    assert all(map(torch.equal, order(order_seed=0, aug_seed=5), reference))
    assert not any(map(torch.equal, order(order_seed=4, aug_seed=1), reference))


@pytest.mark.parametrize('name, sampling, flip', [
    ('airbench94', 'reshuffle', 'alternating'), ('airbench94', 'replacement', 'alternating'),
    ('airbench96_faster', 'reshuffle', 'alternating'), ('airbench94', 'reshuffle', 'random')])
def test_alternating_flip_alternates_each_images_orientation(name, sampling, flip):
    """Epoch 0 mirrors about half the images; then each image's orientation alternates from epoch
    to epoch: also with replacement (an image met again two epochs later has its orientation of
    then) and along airbench96_faster's stream, whose batches cross epochs. The control: random
    flip, a coin per image and epoch, keeps about half the orientations."""
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


def test_training_samples_with_replacement(ab94, monkeypatch):
    """train() passes opt.sampling to its loader: labels 0..63 name the 64 images."""
    epochs = []

    class RecordingLoader(ab94.CifarLoader):
        def __iter__(self):
            epochs.append([])
            for images, labels in super().__iter__():
                epochs[-1].append(labels)
                yield images, labels
    monkeypatch.setattr(ab94, 'CifarLoader', RecordingLoader)
    data = tiny_dataset(num_classes=64, per_class=1)
    for sampling in ('reshuffle', 'replacement'):
        epochs.clear()
        result = quick_train(ab94, data, entries={'opt.sampling': sampling, 'opt.train_epochs': 3,
                                                  'net.tta_level': 0})
        assert result['steps'] == 6 and [len(e) for e in epochs] == [2, 2, 2]
        counts = [torch.bincount(torch.cat(e), minlength=64) for e in epochs]
        assert all((c.max() > 1) == (sampling == 'replacement') for c in counts)


# The paper's switches, and the values they cannot honour: refused by each script whose hyp has
# the switch (airbench94_muon's and airbench94_hiverge's: the flip and TTA ones)
REFUSED = [
    ('opt.sampling=sometimes', "--hyp opt.sampling takes one of ('reshuffle', 'replacement')"),
    ('net.whiten=no', '--hyp net.whiten takes one of (True, False)'),
    ('net.identity_init=2', '--hyp net.identity_init takes one of (True, False)'),
    ('opt.lookahead_every=-5', '--hyp opt.lookahead_every takes a whole number from 0 to inf'),
    ('opt.lookahead_every=2.5', '--hyp opt.lookahead_every takes a whole number from 0 to inf'),
    ('opt.lookahead_every=often', '--hyp opt.lookahead_every takes a whole number from 0 to inf'),
    ('aug.flip=sideways', "--hyp aug.flip takes one of ('alternating', 'random', 'none')"),
    ('net.tta_level=3', '--hyp net.tta_level takes one of (0, 1, 2)'),
]


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_values_a_switch_cannot_honour_are_refused(name):
    script = load_script(name)
    keys = {f'{group}.{key}' for group, entries in script.hyp.items() for key in entries}
    refused = [(setting, message) for setting, message in REFUSED
               if setting.partition('=')[0] in keys]
    assert len(refused) >= 2
    for setting, message in refused:
        with pytest.raises(StudyError, match=re.escape(message)):
            study_hyp(script, [setting])


def test_every_switch_value_is_accepted(ab94):
    settings = ['net.whiten=False', 'net.identity_init=False', 'opt.bias_scaler=1',
                'opt.lookahead_every=0', 'opt.sampling=replacement', 'aug.flip=random',
                'net.tta_level=1']
    run_hyp = study_hyp(ab94, settings)
    assert run_hyp['net'] == {**ab94.hyp['net'], 'whiten': False, 'identity_init': False,
                              'tta_level': 1}
    assert run_hyp['opt'] == {**ab94.hyp['opt'], 'bias_scaler': 1, 'lookahead_every': 0,
                              'sampling': 'replacement'}
    assert run_hyp['aug'] == {**ab94.hyp['aug'], 'flip': 'random'}


def test_validation_checks_only_the_keys_a_scripts_hyp_has(ab94):
    """study.py checks every script by its rules; a script without some switch that its rules
    name (the Muon one has no Lookahead) must still run."""
    bare = copy.deepcopy(ab94.hyp)
    for group, key in (('opt', 'sampling'), ('opt', 'lookahead_every'), ('net', 'whiten'),
                       ('net', 'identity_init')):
        del bare[group][key]
    assert study_hyp(ab94, [], hyp=bare) == bare


def test_airbench94_hiverges_switches_tta_fraction_and_jitter(monkeypatch):
    """airbench94_hiverge's own switches: net.tta_fraction 0 is plain evaluation (each test image
    evaluated once), aug.brightness and aug.contrast 0 turn the jitter off."""
    hiverge = load_script('airbench94_hiverge')
    epochs = spy(monkeypatch, hiverge, 'augmented_images')  # each epoch's augmentation
    net = hiverge.build_net({**hiverge.hyp['net'], 'widths': {'block1': 8, 'block2': 8,
                                                              'block3': 8}}, 2, CPU, 'fp32')
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
