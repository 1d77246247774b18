"""The CUDA path on a machine without a GPU. The meta device runs each script's training step in
the CUDA recipe, and FakeTensorMode with fake CUDA tensors its loader, whitening, optimizer step
and TTA: both raise on a CPU tensor mixed in and on a host synchronization. A dispatch mode records
every operator of a real train(): none that makes the host wait for the device runs while timed."""
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

from conftest import (ALL_SCRIPTS, CPU, TINY_WIDTHS, compile_with_backend, load_script,
                      marked_slow, tiny_dataset, tiny_hyp)
from studylib.hyp import with_entries

META = torch.device('meta')
# With its index: for a bare 'cuda', torch 2.4's Tensor.to asks the CUDA runtime for the current
# device, which fails on a machine without a GPU driver
FAKE_CUDA = torch.device('cuda', 0)
NO_AUTOCAST = torch.autocast('cuda', enabled=False)  # as train() builds it for 'fp16'
# BatchNorm's dtype in each script's CUDA recipe, as its published script has it
BATCHNORM_DTYPES = {**dict.fromkeys(ALL_SCRIPTS, torch.float32),
                    'airbench94_hiverge': torch.float16}
DEVICE_CLOCK_SCRIPTS = ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']
# They build and train airbench94's network (airbench94_compiled eager here): slow tier only
SAME_AS_AIRBENCH94 = ['airbench94_compiled', 'airbench95']


def raises(operation):
    try:
        operation()
    except RuntimeError:
        return True
    return False


def index_fake_cuda():
    with FakeTensorMode():
        torch.empty(2, 2, device=FAKE_CUDA)[:, 0]


def reflect_pad_fp16():
    F.pad(torch.zeros(2, 4, 4, 3, dtype=torch.float16).permute(0, 3, 1, 2), (1,) * 4, 'reflect')


# Skipped where this torch cannot (2.4: docs/tests.md, "Torch versions")
needs_fake_cuda = pytest.mark.skipif(raises(index_fake_cuda), reason=(
    f'torch {torch.__version__} indexes a fake CUDA tensor through the CUDA runtime: no driver'))
needs_cpu_fp16_padding = pytest.mark.skipif(raises(reflect_pad_fp16), reason=(
    f"torch {torch.__version__}'s CPU kernels do not reflect-pad fp16 images in this layout"))


def dtypes(net):
    """Of net's parameters and floating-point buffers (not BatchNorm's counts), by name."""
    return {name: tensor.dtype for name, tensor in [*net.named_parameters(), *net.named_buffers()]
            if tensor.is_floating_point()}


def recipe_dtypes(net, script_name):
    """dtypes(net) in the fp16 recipe: BatchNorm's in BATCHNORM_DTYPES[script_name]."""
    batchnorm = {f'{name}.{entry}' for name, module in net.named_modules()
                 if isinstance(module, nn.BatchNorm2d)
                 for entry in ('weight', 'bias', 'running_mean', 'running_var')}
    return {name: BATCHNORM_DTYPES[script_name] if name in batchnorm else torch.float16
            for name in dtypes(net)}


def uncompiled(monkeypatch):
    monkeypatch.setattr(torch, 'compile', lambda function, **kwargs: function)


def infer_options(script):
    """airbench94_hiverge's selective TTA (topk and its indexing) on half the images."""
    return {'tta_fraction': 0.5} if 'tta_fraction' in script.hyp['net'] else {}


def optimizer_step(script, net, batch_size):
    """As train()'s, Muon in the record's dtype; returns Muon's momentum buffers, or none."""
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
    """airbench96_faster's proxy pass over two batches, a step on the first; returns the main
    network's batch, the first's selected half."""
    proxy = script.build_net(hyp['proxy'], 10, META, 'fp16')
    opt = hyp['opt']
    groups = script.decoupled_sgd_groups(proxy, opt['lr'], opt['weight_decay'], opt['momentum'],
                                         len(labels), opt['bias_scaler'])
    optimizer = torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)
    selections = script.select_hardest(proxy, optimizer, [(inputs, labels)] * 2, 2, [1.0, 1.0], 8,
                                       4, 0.2, NO_AUTOCAST)
    assert [s.shape for s in selections] == [(8,), (8,)] and selections[0].device == META
    assert dtypes(proxy) == recipe_dtypes(proxy, script.__name__)
    with pytest.raises(NotImplementedError):  # the control: a boolean mask has no meta shape
        inputs[torch.empty(16, device=META, dtype=torch.bool)]
    return inputs[selections[0]], labels[selections[0]]


# Tiny networks (the recipe does not depend on width), whitened and identity-initialized; airbench94
# also without them (the first conv trained); airbench94_compiled also compiled, the slow tier:
# aot_eager traces the graphs that inductor would compile and runs them with ATen's operators
@pytest.mark.parametrize('name, whiten, compiled', [
    *[(name, True, False) for name in ALL_SCRIPTS if name not in SAME_AS_AIRBENCH94],
    ('airbench94', False, False),
    *[pytest.param(name, True, False, marks=pytest.mark.slow) for name in SAME_AS_AIRBENCH94],
    *[pytest.param('airbench94_compiled', whiten, True, marks=pytest.mark.slow)
      for whiten in (True, False)]])
def test_whole_training_step_on_the_meta_device_in_the_cuda_recipe(name, whiten, compiled,
                                                                   monkeypatch):
    """Every layer in its published precision, kept by the step, the gradients in it, Muon's
    momentum in the weights' dtype; the logits of TTA in fp32."""
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
    assert dtypes(net) == expected
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
    assert grads == {name: expected[name] for name in grads}
    assert ('0.weight' in grads) == (not whiten)
    assert dtypes(net) == expected  # kept by the step
    assert all(momentum.dtype == torch.float16 for momentum in momenta)
    images = torch.empty(6, 3, 32, 32, device=META, dtype=torch.float16)
    logits = script.infer(net, images, 2, NO_AUTOCAST, batch_size=4, **infer_options(script))
    assert logits.shape == (6, 10) and logits.dtype == torch.float32 and logits.device == META
    with pytest.raises(RuntimeError):  # the control: a CPU tensor mixed in raises
        net(torch.zeros(2, 3, 32, 32, dtype=torch.float16))
    norm = next(module for module in net.modules() if isinstance(module, nn.BatchNorm2d))
    assert norm.running_var.dtype == BATCHNORM_DTYPES[name]  # buffers counted, not only weights
    norm.to(torch.float32 if BATCHNORM_DTYPES[name] == torch.float16 else torch.float16)
    assert dtypes(net) != expected  # the control: one BatchNorm in the other precision


def fake_cuda(module, mode):
    """module with every parameter and buffer a fake CUDA tensor of mode."""
    for submodule in module.modules():
        for name, tensor in [*submodule.named_parameters(recurse=False),
                             *submodule.named_buffers(recurse=False)]:
            fake = mode.from_tensor(tensor.detach())
            with mode:
                fake = fake.to(FAKE_CUDA)
            if isinstance(tensor, nn.Parameter):
                submodule._parameters[name] = nn.Parameter(fake, requires_grad=tensor.requires_grad)
            else:
                submodule._buffers[name] = fake
    return module


@needs_fake_cuda
@pytest.mark.parametrize('name', marked_slow([*SAME_AS_AIRBENCH94, 'airbench96']))
def test_loader_whitening_optimizer_step_and_tta_on_fake_cuda(name, monkeypatch):
    """Every augmentation, sampling and flip of the loader over its first epochs (10 batches of
    300 images). airbench96's block, all it has of its own, runs on the meta device."""
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
        assert dtypes(net) == recipe_dtypes(net, name)
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


HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default, torch.ops.aten.equal.default}
# Linear algebra that checks its solver's status on the host: on CUDA it waits for the device
LINALG_SYNCS = {torch.ops.aten._linalg_eigh.default, torch.ops.aten._linalg_svd.default}
READ_BACK = 'aten._local_scalar_dense.default'


class HostSyncRecorder(TorchDispatchMode):
    """The operators that make the host wait for the device (with linalg, LINALG_SYNCS too), by
    whether `timed` was set; and every operator seen."""

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
    """module.time whose perf_counter() opens and closes the timed region in turn: train() reads
    it in pairs around each timed part."""
    def perf_counter():
        recorder.timed = not recorder.timed
        return real_perf_counter()
    real_perf_counter = module.time.perf_counter
    return types.SimpleNamespace(perf_counter=perf_counter)


def queued_clock(module, recorder):
    """module.DeviceClock as on CUDA: the timed window opens at the first mark and closes at the
    first synchronize(), where on CUDA the host first waits. queued=False: the CPU's clock."""
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
    """train() under a HostSyncRecorder, 2 batches an epoch of 16 images (airbench96_faster's
    stream crossing epochs) for 3.5 epochs: Lookahead's update and the whitening bias's freeze
    among the 7 steps. Returns the recorder, the hyp, train()'s result and its on_epoch figures."""
    batch_size = 6 if script.__name__ == 'airbench96_faster' else 8
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
        result = script.train(tiny_dataset(per_class=8), hyp, CPU, precision, 0,
                              on_epoch=figures.append)
    return recorder, hyp, result, figures


# The paper's ablations, all at once; their run shorter, in fp32, the faster on a CPU
ABLATIONS = {'net.whiten': False, 'net.identity_init': False, 'opt.lookahead_every': 0,
             'opt.sampling': 'replacement', 'opt.bias_scaler': 1.0, 'opt.train_epochs': 1.5}
# Operators that show the run did its work: Muon's Newton-Schulz iteration (batched in
# airbench94_hiverge), the selective TTA's and the proxy's topk
RECORDED_OPS = {'airbench94_muon': {'aten.mm.default'},
                'airbench94_hiverge': {'aten.topk.default', 'aten.index_copy.default',
                                       'aten.bmm.default'},
                'airbench96_faster': {'aten.topk.default'}}


# One case per train(): the paper's scripts share airbench94's (test_layout.py) but
# airbench94_compiled's, timed on a DeviceClock as the Muon scripts are; compiled as on CUDA (in
# fp16 too, the same operators) in the slow tier
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
    (before any training work is queued); every figure is read after the window."""
    script = load_script(name)
    aug = {'aug.cutout': 8} if 'cutout' in script.hyp['aug'] else {}  # every augmentation on
    recorder, hyp, result, figures = recorded_train(
        script, monkeypatch, precision, {**aug, **(ABLATIONS if ablated else {})}, compiled)
    assert not recorder.timed  # the timed regions all closed
    steps = math.ceil(16 // hyp['opt']['batch_size'] * hyp['opt']['train_epochs'])
    assert result['steps'] == steps and 'aten.convolution_backward.default' in recorder.ops
    assert RECORDED_OPS.get(name, set()) <= recorder.ops
    assert [epoch['epoch'] for epoch in figures] == list(range(math.ceil(steps / 2)))
    if hasattr(script, 'DeviceClock'):
        assert recorder.timed_syncs == ['aten._linalg_eigh.default']
        # Each epoch's loss and accuracies, and the TTA accuracy, read after the window
        assert recorder.untimed_syncs.count(READ_BACK) == 3 * len(figures) + 1
    else:
        assert recorder.timed_syncs == []
        # The control: the untimed per-epoch figures do read scalars back, and are seen
        assert READ_BACK in recorder.untimed_syncs


@pytest.mark.parametrize('name, compiled', [
    ('airbench94', False), *[(name, False) for name in DEVICE_CLOCK_SCRIPTS],
    *[pytest.param(name, True, marks=pytest.mark.slow) for name in DEVICE_CLOCK_SCRIPTS]])
def test_the_recorder_sees_a_synchronization_in_the_timed_region(name, compiled, monkeypatch):
    """The controls: each training step's loss read back is seen; on a DeviceClock so are the CPU
    path's per-epoch reads (the CPU queues nothing) on CUDA's clock."""
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
    """As CUDA graphs (max-autotune) run a network: each call returns the graph's own output
    buffer, one per batch size, which the next call overwrites; reuse=False, a new tensor."""

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
    """On the CPU airbench94_compiled compiles in the default mode, so that every mode trains
    alike there, and the Muon scripts compile nothing. Module.to leaves the network on the CPU."""
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
    for device, precision in ((FAKE_CUDA, 'fp16'), (CPU, 'fp32')):
        for mode in choices:
            arch = {**script.hyp['net'], 'widths': TINY_WIDTHS, 'compile_mode': mode}
            script.build_net(arch, 10, device, precision)
    cpu_modes = [None] * len(choices) if name == 'airbench94_compiled' else []
    assert modes == [*choices, *cpu_modes]
