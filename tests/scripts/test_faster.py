"""airbench96_faster.py's own method; what it shares with airbench94 is tested there
(test_layout.py proves the blocks identical)."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import CPU, TINY_WIDTHS, load_script, spy, tiny_dataset
from studylib.hyp import with_entries

NAME = 'airbench96_faster'


@pytest.fixture(scope='module')
def faster():
    return load_script(NAME)


def small(hyp, entries=None):
    return with_entries(hyp, {'net.widths': {'block1': 16, 'block2': 16, 'block3': 16},
                              'proxy.widths': {'block1': 8, 'block2': 8, 'block3': 8},
                              **(entries or {})})


def id_images(n):
    """Images whose every pixel holds the image's id (base 256 over the channels), and the ids."""
    ids = torch.arange(n)
    pixels = torch.stack([ids % 256, ids // 256, torch.zeros_like(ids)], 1).to(torch.uint8)
    return pixels.view(n, 1, 1, 3).expand(n, 32, 32, 3).contiguous(), ids


def test_hyperparameters_are_the_records(faster):
    opt, aug, arch, proxy = (faster.hyp[group] for group in ('opt', 'aug', 'net', 'proxy'))
    assert (opt['train_epochs'], opt['batch_size'], opt['masked_fraction']) == (45, 1024, 0.5)
    assert (opt['lr'], opt['weight_decay'], opt['momentum']) == (9.0, 0.012, 0.85)
    assert (opt['lr_peak_fraction'], opt['lr_end'], opt['lookahead_every']) == (0.1, 0.0, 5)
    assert aug == {'flip': 'alternating', 'translate': 4, 'cutout': 12}
    assert arch['widths'] == {'block1': 128, 'block2': 384, 'block3': 512}
    assert arch['convs_per_block'] == 3 and arch['tta_level'] == 2
    assert proxy['widths'] == {'block1': 32, 'block2': 64, 'block3': 64}
    assert proxy['convs_per_block'] == 2 and proxy['step_every'] == 4
    net = faster.build_net(proxy, 10, CPU, 'fp32')
    assert sum(p.numel() for p in net.parameters()) == 146_744
    assert f'{146_744:,}' in faster.__doc__  # as the header says


def test_the_stream_runs_across_epochs_and_every_pass_repeats_it(faster):
    n = 100  # 3 batches of 32 per epoch and 4 images over: batches cross epochs
    batch_size = 32
    images, ids = id_images(n)
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2)]
    loader = faster.CifarLoader(images, ids, batch_size, (0.0,) * 3, (1 / 255,) * 3,
                                {'flip': 'none', 'translate': 0, 'cutout': 0}, torch.float32,
                                *generators)
    assert len(loader) == 3
    first = [batch for _, batch in zip(range(25), loader)]
    second = [batch for _, batch in zip(range(25), loader)]
    for (images_1, labels_1), (images_2, labels_2) in zip(first, second):
        assert torch.equal(images_1, images_2) and torch.equal(labels_1, labels_2)
    assert all(len(labels) == batch_size for _, labels in first)
    stream = torch.cat([labels for _, labels in first])
    for epoch in range(len(stream) // n):  # each epoch is a permutation of every image, in turn
        assert sorted(stream[epoch * n:(epoch + 1) * n].tolist()) == list(range(n))
    assert stream[:n].tolist() != stream[n:2 * n].tolist()  # reshuffled each epoch
    for batch_images, labels in first:  # images stay with their labels, also across epochs
        assert torch.equal(batch_images[:, 0, 0, 0].round().long() + 256 * batch_images[
            :, 1, 0, 0].round().long(), labels)


def test_hardest_examples_are_the_highest_losses_in_batch_order(faster):
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        losses = torch.rand(1024, generator=generator)
        selected = faster.hardest_examples(losses, 512)
        assert len(selected) == 512 and len(set(selected.tolist())) == 512
        assert torch.all(selected[1:] > selected[:-1])  # in the order of the batch
        rest = ~torch.isin(torch.arange(1024), selected)
        assert losses[selected].min() > losses[rest].max()


def record_training(faster, monkeypatch, hyp, data=None):
    """train(), with a record of what each network saw and each optimizer's lrs at each step."""
    record = dict(passes=[], proxy=[], selections=None, main_inputs=[], proxy_lrs=[], main_lrs=[])
    iterate = faster.CifarLoader.__iter__
    build = faster.build_net
    select = faster.select_hardest

    def recording_iter(loader):
        record['passes'].append([])
        for batch in iterate(loader):
            record['passes'][-1].append(batch)
            yield batch

    def recording_build(arch, *args):
        net = build(arch, *args)
        if arch is hyp['proxy']:
            net.register_forward_hook(lambda module, inputs, output: record['proxy'].append(
                (inputs[0], output.detach(), torch.is_grad_enabled())))
        else:
            net.register_forward_pre_hook(lambda module, inputs: record['main_inputs'].append(
                inputs[0]) if module.training else None)
        return net

    def recording_select(proxy, optimizer, *args):
        optimizer.is_proxy = True
        record['selections'] = select(proxy, optimizer, *args)
        return record['selections']

    sgd_step = torch.optim.SGD.step
    def recording_sgd_step(optimizer, *args, **kwargs):
        lrs = 'proxy_lrs' if hasattr(optimizer, 'is_proxy') else 'main_lrs'
        record[lrs].append([group['lr'] for group in optimizer.param_groups])
        return sgd_step(optimizer, *args, **kwargs)

    monkeypatch.setattr(faster.CifarLoader, '__iter__', recording_iter)
    monkeypatch.setattr(faster, 'build_net', recording_build)
    monkeypatch.setattr(faster, 'select_hardest', recording_select)
    monkeypatch.setattr(torch.optim.SGD, 'step', recording_sgd_step)
    result = faster.train(data or tiny_dataset(), hyp, CPU, 'fp32', 0, epoch_eval=False)
    return record, result


def test_proxy_and_main_network_see_the_same_batches_and_train_on_the_hardest(faster, monkeypatch):
    # 64 images: 2 batches per epoch, crossing epochs
    hyp = small(faster.hyp, {'opt.batch_size': 24, 'opt.train_epochs': 3.5, 'net.tta_level': 0})
    record, result = record_training(faster, monkeypatch, hyp)
    total_steps = math.ceil(2 * 3.5)
    assert result['steps'] == total_steps
    proxy_pass, main_pass = record['passes']  # two passes over the loader, nothing more
    assert len(proxy_pass) == len(main_pass) == total_steps
    for (proxy_images, proxy_labels), (main_images, main_labels) in zip(proxy_pass, main_pass):
        assert torch.equal(proxy_images, main_images) and torch.equal(proxy_labels, main_labels)
    assert len(record['proxy']) == len(record['selections']) == total_steps
    assert len(record['main_inputs']) == total_steps
    for step, ((images, labels), (inputs, logits, grad_enabled), selected, trained) in enumerate(
            zip(proxy_pass, record['proxy'], record['selections'], record['main_inputs'])):
        assert torch.equal(inputs, images)
        assert grad_enabled == (step % 4 == 0)  # a training step on every fourth batch only
        losses = F.cross_entropy(logits.float(), labels, label_smoothing=0.2, reduction='none')
        assert len(selected) == 12 and len(set(selected.tolist())) == 12  # masked_fraction 0.5
        rest = ~torch.isin(torch.arange(24), selected)
        assert losses[selected].min() >= losses[rest].max()
        assert torch.equal(trained, images[selected])  # the main network trains on exactly those
    assert len(record['proxy_lrs']) == math.ceil(total_steps / 4)


def test_the_proxy_trains_only_on_its_selection(faster):
    """Its step's gradient is the selected examples' summed loss's, not the whole batch's."""
    torch.manual_seed(0)
    hyp = small(faster.hyp)
    proxy = faster.build_net(hyp['proxy'], 2, CPU, 'fp32')
    proxy[0].bias.requires_grad = False
    data = tiny_dataset()
    loader = faster.CifarLoader(data['train']['images'], data['train']['labels'], 16,
                                data['mean'], data['std'], hyp['aug'])
    inputs, labels = next(iter(loader))
    optimizer = torch.optim.SGD(proxy.parameters(), lr=0.0)  # records gradients, changes nothing
    (selected,) = faster.select_hardest(proxy, optimizer, [(inputs, labels)], 1, [1.0], 8, 4, 0.2,
                                        torch.autocast('cpu', enabled=False))
    recorded = [p.grad.clone() for p in proxy.parameters() if p.requires_grad]
    proxy.zero_grad()
    losses = F.cross_entropy(proxy(inputs), labels, label_smoothing=0.2, reduction='none')
    losses[selected].sum().backward()
    expected = [p.grad for p in proxy.parameters() if p.requires_grad]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(recorded, expected))
    proxy.zero_grad()  # the control: the whole batch's loss has another gradient
    F.cross_entropy(proxy(inputs), labels, label_smoothing=0.2, reduction='sum').backward()
    assert not torch.allclose(recorded[-1], proxy[-2].weight.grad, atol=1e-6)


def test_both_networks_follow_the_schedule(faster, monkeypatch):
    # 16 images in batches of 8 for 10 epochs: 20 steps, the peak at 2
    hyp = small(faster.hyp, {'opt.batch_size': 8, 'opt.train_epochs': 10, 'net.tta_level': 0})
    record, _ = record_training(faster, monkeypatch, hyp, data=tiny_dataset(per_class=8))
    multipliers = faster.lr_schedule(20, peak_fraction=0.1, end=0.0).tolist()
    kilostep_scale = 1024 * (1 + 1 / (1 - 0.85))
    base_lr = 9.0 / kilostep_scale
    assert [lrs[1] for lrs in record['main_lrs']] == pytest.approx(
        [base_lr * m for m in multipliers[:20]])
    assert [lrs[0] for lrs in record['main_lrs']] == pytest.approx(
        [64 * base_lr * m for m in multipliers[:20]])
    assert [lrs[1] for lrs in record['proxy_lrs']] == pytest.approx(
        [base_lr * m for m in multipliers[0:20:4]])


class Selected(Exception):
    """Raised where the proxy's pass would start: train() stops there."""


def test_the_proxys_initialization_follows_the_init_seed_only(faster, monkeypatch):
    initial = []

    def first_selection(proxy, *args):
        initial.append(proxy[-2].weight.detach().clone())  # the head: PyTorch's random init
        raise Selected
    monkeypatch.setattr(faster, 'select_hardest', first_selection)
    seeds = faster.source_seeds(0)
    hyp = small(faster.hyp, {'opt.batch_size': 16, 'opt.train_epochs': 1})
    # Its own seed, not the main network's draws continued: the main widths do not change it
    wider = with_entries(hyp, {'net.widths': {'block1': 24, 'block2': 16, 'block3': 16}})
    for run_hyp, changes in ((hyp, {}), (hyp, {'order': 7, 'aug': 8}), (hyp, {'init': 7}),
                             (wider, {})):
        with pytest.raises(Selected):
            faster.train(tiny_dataset(), run_hyp, CPU, 'fp32', {**seeds, **changes})
    assert torch.equal(initial[0], initial[1]) and not torch.equal(initial[0], initial[2])
    assert torch.equal(initial[0], initial[3])


def test_the_proxy_is_airbench94s_network_and_the_main_block_adds_before_its_last_gelu(faster):
    torch.manual_seed(0)
    proxy = faster.make_net(faster.hyp['proxy']['widths'], 10, 0.6, 1 / 9, convs_per_block=2)
    assert not any(hasattr(block, 'conv3') for block in proxy[2:5])
    ab94 = load_script('airbench94')
    reference = ab94.make_net(faster.hyp['proxy']['widths'], 10, 0.6, 1 / 9)
    assert proxy.state_dict().keys() == reference.state_dict().keys()
    reference.load_state_dict(proxy.state_dict())
    x = torch.randn(3, 3, 32, 32)
    assert torch.allclose(proxy(x), reference(x), atol=1e-6)
    # the record's block: conv, pool, BN, GELU; then conv, BN, GELU, conv, BN, + input, GELU
    block = faster.make_net(TINY_WIDTHS, 10, 0.9, 1 / 9)[2].eval()
    x = torch.randn(3, 24, 31, 31)
    first = F.gelu(block.norm1(block.pool(block.conv1(x))))
    branch = block.norm3(block.conv3(F.gelu(block.norm2(block.conv2(first)))))
    assert torch.allclose(block(x), F.gelu(first + branch), atol=1e-6)
    airbench96_style = first + F.gelu(branch)
    assert not torch.allclose(block(x), airbench96_style, atol=1e-3)


def test_airbench96s_switches_apply_to_both_networks(faster, monkeypatch):
    """Without whitening both first convs keep their default init and train (the proxy's is not
    the main network's); sampling with replacement repeats images; lookahead_every 0: none."""
    selections = spy(monkeypatch, faster, 'select_hardest')
    monkeypatch.setattr(faster, 'LookaheadState', lambda net: pytest.fail('Lookahead made'))
    hyp = small(faster.hyp, {'opt.batch_size': 16, 'opt.train_epochs': 2, 'net.tta_level': 0,
                             'opt.sampling': 'replacement', 'opt.lookahead_every': 0,
                             'net.whiten': False, 'net.identity_init': False})
    result = faster.train(tiny_dataset(), hyp, CPU, 'fp32', 0, epoch_eval=False)
    ((proxy, *_),) = selections
    net = result['net']
    assert proxy[0].weight.requires_grad and proxy[0].bias.requires_grad
    assert net[0].weight.requires_grad and net[0].bias.requires_grad
    assert not torch.equal(proxy[0].weight, net[0].weight)
    images, ids = id_images(64)
    loader = faster.CifarLoader(images, ids, 16, (0.0,) * 3, (1.0,) * 3, hyp['aug'],
                                sampling='replacement')
    epoch = torch.cat([labels for _, (_, labels) in zip(range(4), loader)])
    assert len(set(epoch.tolist())) < 64  # some drawn twice
