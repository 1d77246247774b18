"""The CUDA path, checked on a machine without a GPU, each property by one test over the scripts
(what differs between them, their optimizer step and airbench96_faster's proxy, in helpers).

- The meta device runs each script's whole training step in the CUDA precision recipe (fp16 weights
  and activations, BatchNorm in its published script's precision, channels_last): a CPU tensor
  mixed in raises, and so does a host synchronization (.item() on a meta tensor).
- FakeTensorMode with fake CUDA tensors runs each script's loader, whitening init, optimizer step
  and TTA: it raises on a CPU tensor mixed in and on a host synchronization (.item(), boolean-mask
  indexing), as the control cases show.
- A dispatch mode records every operator of a real train() on the CPU: no operator that makes the
  host wait for the device runs inside the timed region; on a DeviceClock, as it times on CUDA,
  one window from the first mark to the host's first wait (compiled as on CUDA: the slow tier).
"""
import itertools
import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                          DynamicOutputShapeException, FakeTensorMode)
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import (ALL_SCRIPTS, CPU, FAKE_CUDA, compile_with_backend, load_script,
                      needs_cpu_fp16_padding, needs_fake_cuda, tiny_dataset, tiny_hyp)
from studylib.hyp import with_entries

META = torch.device('meta')
NO_AUTOCAST = torch.autocast('cuda', enabled=False)  # as train() builds it for 'fp16'
# BatchNorm's dtype in each script's CUDA recipe, as in its published script: the paper's scripts
# and the Muon record put BatchNorm back in fp32 after halving the network (airbench96_faster's
# record too); hiverge/cifar10-speedrun's CifarNet halves every module, BatchNorm too
BATCHNORM_DTYPES = {**dict.fromkeys(ALL_SCRIPTS, torch.float32),
                    'airbench94_hiverge': torch.float16}
DEVICE_CLOCK_SCRIPTS = ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']


def floating_entries(net):
    """{name: tensor} of net's parameters and floating-point buffers (not BatchNorm's counts)."""
    return {name: tensor for name, tensor in [*net.named_parameters(), *net.named_buffers()]
            if tensor.is_floating_point()}


def recipe_dtypes(net, script_name):
    """{parameter or floating buffer name: its dtype in the fp16 recipe}: BatchNorm's weight, bias
    and running statistics in BATCHNORM_DTYPES[script_name], every other layer's in fp16."""
    batchnorm = {f'{name}.{entry}' for name, module in net.named_modules()
                 if isinstance(module, nn.BatchNorm2d)
                 for entry in ('weight', 'bias', 'running_mean', 'running_var')}
    return {name: BATCHNORM_DTYPES[script_name] if name in batchnorm else torch.float16
            for name in floating_entries(net)}


def recipe_dtypes_held(net, script_name):
    """Whether every parameter and floating buffer of net has its dtype of the fp16 recipe."""
    return {name: t.dtype for name, t in floating_entries(net).items()} == recipe_dtypes(
        net, script_name)


def uncompiled(monkeypatch):
    """torch.compile returns what it is given: the network built, run eagerly."""
    monkeypatch.setattr(torch, 'compile', lambda function, **kwargs: function)


def infer_options(script):
    """infer's keywords beyond the common ones: airbench94_hiverge's selective TTA (topk and its
    indexing) on half the images."""
    return {'tta_fraction': 0.5} if 'tta_fraction' in script.hyp['net'] else {}


def optimizer_step(script, net, batch_size):
    """One step of train()'s optimizers on net's gradients: SGD in decoupled groups, then a
    Lookahead update (the paper's scripts, airbench96_faster); or SGD on the biases and the head,
    Muon on the filters, in the record's Newton-Schulz dtype (bf16; airbench94_hiverge's fp16, its
    renormalization flag a tensor on the device). Returns Muon's momentum buffers, or none."""
    opt = script.hyp['opt']
    if not hasattr(script, 'Muon'):
        groups = script.decoupled_sgd_groups(net, opt['lr'], opt['weight_decay'], opt['momentum'],
                                             batch_size, opt['bias_scaler'])
        torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True).step()
        script.LookaheadState(net).update(net, decay=0.5)
        return []
    filters, groups = script.optimizer_groups(net, opt['bias_lr'], opt['head_lr'],
                                              opt['weight_decay'], batch_size)
    torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True).step()
    if 'renorm_every' in opt:
        muon = script.Muon(filters, opt['filter_lr'], opt['filter_momentum'], 3,
                           opt['weight_decay'] * batch_size, torch.float16)
        muon.step(torch.ones((), dtype=torch.bool, device=filters[0].device))
    else:
        muon = script.Muon(filters, opt['filter_lr'], opt['filter_momentum'], 3, torch.bfloat16)
        muon.step()
    return [muon.state[weight]['momentum'] for weight in filters]


def proxy_selection(script, hyp, inputs, labels):
    """airbench96_faster's proxy pass on the meta device over two batches, a step on the first:
    the main network's batch, the selected half of the first."""
    proxy = script.build_net(hyp['proxy'], 10, META, 'fp16')
    opt = hyp['opt']
    groups = script.decoupled_sgd_groups(proxy, opt['lr'], opt['weight_decay'], opt['momentum'],
                                         len(labels), opt['bias_scaler'])
    optimizer = torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)
    selections = script.select_hardest(proxy, optimizer, [(inputs, labels)] * 2, 2, [1.0, 1.0], 8,
                                       4, 0.2, NO_AUTOCAST)
    assert [s.shape for s in selections] == [(8,), (8,)] and selections[0].device == META
    assert recipe_dtypes_held(proxy, script.__name__)
    with pytest.raises(NotImplementedError):  # the control: a boolean mask has no meta shape
        inputs[torch.empty(16, device=META, dtype=torch.bool)]
    return inputs[selections[0]], labels[selections[0]]


# Every script's tiny network (the recipe does not depend on width) with whitening and identity
# init; airbench94 also without them, the paper's ablations (the first conv trained; the scripts
# share reinitialize: test_layout.py); airbench94_compiled also compiled, the slow tier: inductor
# generates no code for the meta device, aot_eager traces the same graphs (forward and backward,
# through dynamo and AOTAutograd) and runs them with ATen's operators
@pytest.mark.parametrize('name, whiten, compiled', [
    *[(name, True, False) for name in ALL_SCRIPTS], ('airbench94', False, False),
    *[pytest.param('airbench94_compiled', whiten, True, marks=pytest.mark.slow)
      for whiten in (True, False)]])
def test_whole_training_step_on_the_meta_device_in_the_cuda_recipe(name, whiten, compiled,
                                                                   monkeypatch):
    """Every layer in its published precision (BATCHNORM_DTYPES), kept by the step, the gradients
    in it, Muon's momentum in the weights' dtype; the logits of TTA in fp32."""
    if compiled:
        compile_with_backend(monkeypatch, 'aot_eager')
    else:
        uncompiled(monkeypatch)
    script = load_script(name)
    hyp = with_entries(script.hyp, tiny_hyp(name))
    net = script.build_net(hyp['net'], 10, META, 'fp16')
    if not whiten:
        script.reinitialize(net, whiten=False, identity_init=False)
    expected = recipe_dtypes(net, name)
    assert recipe_dtypes_held(net, name)
    assert net[2].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    inputs = torch.empty(16, 3, 32, 32, device=META, dtype=torch.float16)
    inputs = inputs.contiguous(memory_format=torch.channels_last)
    labels = torch.empty(16, device=META, dtype=torch.int64)
    if name == 'airbench96_faster':
        inputs, labels = proxy_selection(script, hyp, inputs, labels)
    outputs = net(inputs)
    loss = F.cross_entropy(outputs.float(), labels, reduction='sum',
                           label_smoothing=script.hyp['opt']['label_smoothing'])
    loss.backward()
    momenta = optimizer_step(script, net, 16)
    assert outputs.shape == (len(labels), 10)
    assert outputs.dtype == torch.float16 and loss.dtype == torch.float32
    grads = {name: p.grad.dtype for name, p in net.named_parameters() if p.requires_grad}
    assert grads == {name: dtype for name, dtype in expected.items() if name in grads}
    assert set(grads) == {n for n, p in net.named_parameters() if p.requires_grad} and grads
    assert ('0.weight' in grads) == (not whiten)  # without whitening the first conv is trained
    assert recipe_dtypes_held(net, name)  # kept by the step
    assert all(momentum.dtype == torch.float16 for momentum in momenta)  # the weights' dtype
    images = torch.empty(10, 3, 32, 32, device=META, dtype=torch.float16)
    logits = script.infer(net, images, 2, NO_AUTOCAST, batch_size=4, **infer_options(script))
    assert logits.shape == (10, 10) and logits.dtype == torch.float32 and logits.device == META
    with pytest.raises(RuntimeError):  # the control: a CPU tensor mixed in raises
        net(torch.zeros(2, 3, 32, 32, dtype=torch.float16))
    norm = next(module for module in net.modules() if isinstance(module, nn.BatchNorm2d))
    assert norm.running_var.dtype == BATCHNORM_DTYPES[name]  # buffers counted, not only weights
    norm.to(torch.float32 if BATCHNORM_DTYPES[name] == torch.float16 else torch.float16)
    assert not recipe_dtypes_held(net, name)  # the control: one BatchNorm in the other precision


def fake_cuda(module, mode):
    """module with every parameter and buffer replaced by a fake CUDA tensor of mode."""
    for submodule in module.modules():
        for name, parameter in list(submodule.named_parameters(recurse=False)):
            fake = mode.from_tensor(parameter.detach())
            with mode:
                fake = fake.to(FAKE_CUDA)
            submodule._parameters[name] = nn.Parameter(fake, requires_grad=parameter.requires_grad)
        for name, buffer in list(submodule.named_buffers(recurse=False)):
            fake = mode.from_tensor(buffer)
            with mode:
                submodule._buffers[name] = fake.to(FAKE_CUDA)
    return module


def select_on_fake_cuda(script, hyp, mode, batches):
    """What airbench96_faster's proxy pass does with each batch, but the backward pass (which
    cannot run on fake CUDA tensors: the whole pass runs on the meta device above): the record's
    boolean mask would raise here, the hardest examples' indices do not."""
    proxy = fake_cuda(script.build_net(hyp['proxy'], 10, CPU, 'fp16'), mode)
    with mode, torch.no_grad():
        for inputs, labels in batches:
            losses = F.cross_entropy(proxy(inputs).float(), labels, label_smoothing=0.2,
                                     reduction='none')
            selected = script.hardest_examples(losses, 32)
            assert selected.shape == (32,) and selected.device.type == 'cuda'
            assert inputs[selected].shape == (32, 3, 32, 32)
            assert losses.gather(0, selected).sum().shape == ()
        with pytest.raises(DynamicOutputShapeException):  # the control: the record's mask
            mask = torch.zeros(64, dtype=torch.bool, device=FAKE_CUDA)
            mask[losses.argsort()[-32:]] = True
            inputs[mask]


@needs_fake_cuda
@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_loader_whitening_optimizer_step_and_tta_on_fake_cuda(name, monkeypatch):
    """Every augmentation on, each sampling and flip of the loader over its first epochs (in
    airbench96_faster's stream, which runs across them, 10 batches of 300 images)."""
    uncompiled(monkeypatch)
    script = load_script(name)
    hyp = with_entries(script.hyp, tiny_hyp(name))
    if 'cutout' in hyp['aug']:
        hyp['aug']['cutout'] = 8
    mode = FakeTensorMode()
    net = fake_cuda(script.build_net(hyp['net'], 10, CPU, 'fp16'), mode)
    with mode:
        images = torch.empty(300, 32, 32, 3, dtype=torch.uint8, device=FAKE_CUDA)
        labels = torch.empty(300, dtype=torch.int64, device=FAKE_CUDA)
        for sampling in script.HYP_CHOICES.get('opt.sampling', ['reshuffle']):
            for flip in script.HYP_CHOICES['aug.flip']:
                loader = script.CifarLoader(images, labels, 64, (0.5,) * 3, (0.25,) * 3,
                                            {**hyp['aug'], 'flip': flip}, torch.float16,
                                            sampling=sampling)
                epochs = itertools.chain(loader, loader, loader)  # airbench96_faster's: endless
                batches = list(itertools.islice(epochs, 2 * len(loader) + 2))
                assert len(batches) == 10 and {b.shape for b, _ in batches} == {(64, 3, 32, 32)}
                assert {t.device.type for batch in batches for t in batch} == {'cuda'}
                assert {b.dtype for b, _ in batches} == {torch.float16}
        normalized = loader.normalize(loader.images)
        script.init_whitening(net[0], normalized[:200], 5e-4)
        for parameter in net.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.empty_like(parameter)
        optimizer_step(script, net, 64)
        assert recipe_dtypes_held(net, name)
        assert {p.device.type for p in net.parameters()} == {'cuda'}
        logits = script.infer(net, normalized, 2, NO_AUTOCAST, **infer_options(script))
        assert logits.shape == (300, 10) and logits.device.type == 'cuda'

        # The controls: what this mode raises on (a CPU tensor mixed in, where a CUDA one is fine)
        images.float() + torch.ones(32, 32, 3, device=FAKE_CUDA)
        with pytest.raises(RuntimeError):
            images.float() + torch.ones(32, 32, 3)
        with pytest.raises(DataDependentOutputException):
            images.float().sum().item()
        with pytest.raises(DynamicOutputShapeException):
            images[images > 3]
    if name == 'airbench96_faster':
        select_on_fake_cuda(script, hyp, mode, batches)


HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default, torch.ops.aten.equal.default}
# Linear algebra that checks its solver's status on the host: on CUDA it waits for the device
LINALG_SYNCS = {torch.ops.aten._linalg_eigh.default, torch.ops.aten._linalg_svd.default}
READ_BACK = 'aten._local_scalar_dense.default'


class HostSyncRecorder(TorchDispatchMode):
    """Records the operators that make the host wait for the device (scalars read back,
    data-dependent shapes; with linalg, also LINALG_SYNCS) while `timed` is set, and all operators
    seen."""

    def __init__(self, linalg=False):
        super().__init__()
        self.timed = False
        self.timed_syncs = []
        self.untimed_syncs = []
        self.ops = set()
        self.syncs = HOST_SYNCS | LINALG_SYNCS if linalg else HOST_SYNCS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        bool_index = func is torch.ops.aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1])
        if func in self.syncs or bool_index:
            (self.timed_syncs if self.timed else self.untimed_syncs).append(str(func))
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def timed_region_tracker(module, recorder):
    """A stand-in for module.time whose perf_counter() alternately opens and closes the timed
    region: train() calls it in pairs around each timed part."""
    def perf_counter():
        recorder.timed = not recorder.timed
        return real_perf_counter()
    real_perf_counter = module.time.perf_counter
    return types.SimpleNamespace(perf_counter=perf_counter)


def queued_clock(module, recorder):
    """A stand-in for module.DeviceClock as it runs on CUDA, on the host's clock: its marks are
    events, which the host reads only after their synchronize(); the recorder's timed window opens
    at the first mark and closes at the first synchronize(), where on CUDA the host first waits
    for the device. queued=False: the clock of the CPU's path, its marks alike."""
    class Event:
        def __init__(self):
            self.time = real_perf_counter()

        def synchronize(self):
            recorder.timed = False

        def elapsed_time(self, end):  # milliseconds, as CUDA events give them
            return 1000 * (end.time - self.time)

        def __sub__(self, start):  # seconds, as the host's clock gives them
            return self.time - start.time

    class QueuedClock(module.DeviceClock):
        def __init__(self, device, queued=True):
            super().__init__(device)
            self.queued = queued

        def mark(self):
            recorder.timed = recorder.timed or not self.marks
            self.marks.append(Event())
    real_perf_counter = module.time.perf_counter
    return QueuedClock


def recorded_train(script, monkeypatch, precision, entries=None, compiled=False, queued=True):
    """script.train() under a HostSyncRecorder on a tiny network's run of 2 batches an epoch (of
    32; airbench96_faster's of 24, its stream crossing epochs) for 3.5 epochs: 7 steps, Lookahead's
    update and the whitening bias's freeze among them. The timed region: between the reads of the
    host's clock, which train() makes in pairs around each timed part; on a DeviceClock, the window
    of queued_clock (queued: as on CUDA), compiled as on CUDA where compiled (aot_eager's graphs
    run their ATen operators, which the recorder sees), else eager. Returns the recorder, the hyp,
    train()'s result and the figures it gave on_epoch."""
    batch_size = 24 if script.__name__ == 'airbench96_faster' else 32
    hyp = with_entries(script.hyp, {**tiny_hyp(script.__name__), 'opt.batch_size': batch_size,
                                    'opt.train_epochs': 3.5, **(entries or {})})
    device_clock = hasattr(script, 'DeviceClock')
    recorder = HostSyncRecorder(linalg=device_clock)
    if compiled:
        compile_with_backend(monkeypatch, 'aot_eager')
        monkeypatch.setattr(script, 'compiles', lambda device: True, raising=False)
        torch._dynamo.reset()
    else:
        uncompiled(monkeypatch)
    if device_clock:
        clock_class = queued_clock(script, recorder)
        monkeypatch.setattr(script, 'DeviceClock', lambda device: clock_class(device, queued))
    else:
        monkeypatch.setattr(script, 'time', timed_region_tracker(script, recorder))
    figures = []
    with recorder:
        result = script.train(tiny_dataset(), hyp, CPU, precision, 0, on_epoch=figures.append)
    return recorder, hyp, result, figures


# The paper's ablations, all at once; their run is shorter, and in fp32, the faster on a CPU
ABLATIONS = {'net.whiten': False, 'net.identity_init': False, 'opt.lookahead_every': 0,
             'opt.sampling': 'replacement', 'opt.bias_scaler': 1.0, 'opt.train_epochs': 1.5}
# Operators that show the run did its work: the backward pass, Muon's Newton-Schulz iteration
# (batched in airbench94_hiverge), the selective TTA's and the proxy's topk
RECORDED_OPS = {'airbench94_muon': {'aten.mm.default'},
                'airbench94_hiverge': {'aten.topk.default', 'aten.index_copy.default',
                                       'aten.bmm.default'},
                'airbench96_faster': {'aten.topk.default'}}


# One case per train(): the paper's scripts share airbench94's (test_layout.py), but
# airbench94_compiled, which is timed on a DeviceClock as the Muon scripts are: eagerly here, as on
# CUDA (compiled; in fp16 too, slower and the same operators) in the slow tier
@pytest.mark.parametrize('name, ablated, precision, compiled', [
    *[pytest.param(name, False, 'fp16', False, marks=needs_cpu_fp16_padding)
      for name in ('airbench94', 'airbench96_faster')],
    ('airbench94', True, 'fp32', False),
    *[(name, False, 'fp32', False) for name in DEVICE_CLOCK_SCRIPTS],
    *[pytest.param(name, False, precision, True, marks=[pytest.mark.slow, *marks])
      for name in DEVICE_CLOCK_SCRIPTS
      for precision, marks in (('fp32', []), ('fp16', [needs_cpu_fp16_padding]))]])
def test_no_host_synchronization_inside_the_timed_region(name, ablated, precision, compiled,
                                                         monkeypatch):
    """On a DeviceClock, one window from the whitening init to the test predictions, in which the
    host never waits for the device but where the whitening's eigendecomposition checks its solver
    (as the published scripts' SVD, before any training work is queued); every figure is read
    after the window: the per-epoch ones, then passed to on_epoch, and the TTA accuracy."""
    script = load_script(name)
    aug = {'aug.cutout': 8} if 'cutout' in script.hyp['aug'] else {}  # every augmentation on
    recorder, hyp, result, figures = recorded_train(
        script, monkeypatch, precision, {**aug, **(ABLATIONS if ablated else {})}, compiled)
    assert not recorder.timed  # the timed regions all closed
    steps = math.ceil(64 // hyp['opt']['batch_size'] * hyp['opt']['train_epochs'])
    assert result['steps'] == steps and 'aten.convolution_backward.default' in recorder.ops
    assert RECORDED_OPS.get(name, set()) <= recorder.ops
    assert [epoch['epoch'] for epoch in figures] == list(range(math.ceil(steps / 2)))
    if hasattr(script, 'DeviceClock'):
        assert recorder.timed_syncs == ['aten._linalg_eigh.default']
        # The per-epoch figures' (loss, accuracies) and the TTA accuracy's reads, after the window
        assert recorder.untimed_syncs.count(READ_BACK) == 3 * len(figures) + 1
    else:
        assert recorder.timed_syncs == []
        # The control: the untimed per-epoch figures do read scalars back, and are seen
        assert READ_BACK in recorder.untimed_syncs


@pytest.mark.parametrize('name, compiled', [
    ('airbench94', False), *[(name, False) for name in DEVICE_CLOCK_SCRIPTS],
    *[pytest.param(name, True, marks=pytest.mark.slow) for name in DEVICE_CLOCK_SCRIPTS]])
def test_the_recorder_sees_a_synchronization_in_the_timed_region(name, compiled, monkeypatch):
    """The controls: a value of each training step read back (the loss, where the network's
    forward computes it) is seen in the timed region; on a DeviceClock so are the CPU path's
    per-epoch reads (right there: the CPU queues nothing) on CUDA's clock."""
    script = load_script(name)
    build_net = script.build_net

    def read_back(module, inputs, output):
        if module.training:
            (output[-1] if isinstance(output, tuple) else output).sum().item()

    def reading_net(*args):
        net = build_net(*args)
        net.register_forward_hook(read_back)
        return net
    monkeypatch.setattr(script, 'build_net', reading_net)
    recorder, _, result, _ = recorded_train(script, monkeypatch, 'fp32', compiled=compiled)
    assert recorder.timed_syncs.count(READ_BACK) >= result['steps']  # every step
    if hasattr(script, 'DeviceClock'):
        monkeypatch.undo()
        script = load_script(name)
        recorder, *_ = recorded_train(script, monkeypatch, 'fp32', compiled=compiled, queued=False)
        assert recorder.timed_syncs.count(READ_BACK) >= 3 * 3


class OneOutputBuffer(nn.Module):
    """A network as CUDA graphs (max-autotune) run it: each call returns the graph's own output
    buffer, one per batch size, overwritten by the next call (in fp32, .float() returns that same
    buffer); reuse=False, a new tensor each call. Its logits differ between TTA's views."""

    def __init__(self, reuse=True):
        super().__init__()
        self.reuse = reuse
        self.out = {}

    def forward(self, x):
        logits = x[:, :, 1:-1, 1:-1].mean((2, 3)).repeat(1, 4)[:, :10].contiguous()
        if not self.reuse:
            return logits
        return self.out.setdefault(len(x), torch.zeros(len(x), 10)).copy_(logits)


@pytest.mark.parametrize('name', DEVICE_CLOCK_SCRIPTS)
@pytest.mark.parametrize('tta_level', [0, 2])
def test_infer_keeps_outputs_that_the_next_call_overwrites(name, tta_level):
    """The scripts compiled on CUDA: 5 batches, each batch's logits its own."""
    script = load_script(name)
    images = torch.randn(40, 3, 32, 32)
    autocast = torch.autocast('cpu', enabled=False)
    options = dict(batch_size=8, **infer_options(script))
    expected = script.infer(OneOutputBuffer(reuse=False), images, tta_level, autocast, **options)
    logits = script.infer(OneOutputBuffer(), images, tta_level, autocast, **options)
    assert torch.equal(logits, expected)
    # The control: airbench94's infer, without the clone, gives every batch the last batch's
    eager = load_script('airbench94')
    plain = eager.infer(OneOutputBuffer(reuse=False), images, 0, autocast, batch_size=8)
    wrong = eager.infer(OneOutputBuffer(), images, 0, autocast, batch_size=8)
    assert not torch.equal(wrong, plain) and torch.equal(wrong[:8], plain[32:])


@pytest.mark.parametrize('name', DEVICE_CLOCK_SCRIPTS)
def test_the_network_compiles_in_the_hyp_mode_on_cuda_and_the_default_on_the_cpu(name,
                                                                                 monkeypatch):
    """hyp's net.compile_mode reaches torch.compile for the network on CUDA, each of its four
    choices; on the CPU airbench94_compiled compiles in inductor's default mode whatever the entry
    says (so every mode trains alike there) and the Muon scripts compile nothing. The network
    cannot be moved to a GPU here: Module.to leaves it where it is, which is all this test fakes."""
    script = load_script(name)
    modes = []

    def recording_compile(function, mode=None, **kwargs):
        modes.append(mode)
        return function
    monkeypatch.setattr(torch, 'compile', recording_compile)
    monkeypatch.setattr(nn.Module, 'to', lambda module, *args, **kwargs: module)
    choices = script.HYP_CHOICES['net.compile_mode']
    assert choices == ('max-autotune', 'max-autotune-no-cudagraphs', 'reduce-overhead', 'default')
    assert script.hyp['net']['compile_mode'] == 'max-autotune'
    for mode in choices:
        script.build_net({**script.hyp['net'], 'compile_mode': mode}, 10, FAKE_CUDA, 'fp16')
    assert modes == list(choices)
    modes.clear()
    for mode in choices:
        script.build_net({**script.hyp['net'], 'compile_mode': mode}, 10, CPU, 'fp32')
    assert modes == ([None] * len(choices) if name == 'airbench94_compiled' else [])
