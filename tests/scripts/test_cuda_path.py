"""The CUDA path, checked on a machine without a GPU.

- The meta device runs each script's whole training step in the CUDA precision recipe (fp16 weights
  and activations, BatchNorm in its published script's precision, channels_last): a CPU tensor
  mixed in raises, and so does a host synchronization (.item() on a meta tensor).
- FakeTensorMode with fake CUDA tensors runs the loader's epoch, the whitening init, Lookahead and
  TTA: it raises on a CPU tensor mixed in and on a host synchronization (.item(), boolean-mask
  indexing), as the messages of the control cases below show.
- A dispatch mode records every operator of a real train() on the CPU: no operator that makes the
  host wait for the device runs inside the timed region. For the scripts timed on a DeviceClock
  (airbench94_compiled, airbench94_muon, airbench94_hiverge), also as it times on CUDA
  (queued_clock): one window from the first mark to the host's first wait.
"""
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                          DynamicOutputShapeException, FakeTensorMode)
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import (ALL_SCRIPTS, CPU, FAKE_CUDA, NARROW_WIDTHS, compile_with_backend,
                      load_script, needs_cpu_fp16_padding, needs_fake_cuda, tiny_dataset, with_hyp)

META = torch.device('meta')
# BatchNorm's dtype in each script's CUDA recipe, as in its published script: the paper's scripts
# and the Muon record put BatchNorm back in fp32 after halving the network (airbench96_faster's
# record too); hiverge/cifar10-speedrun's CifarNet halves every module, BatchNorm too
BATCHNORM_DTYPES = {**dict.fromkeys(ALL_SCRIPTS, torch.float32),
                    'airbench94_hiverge': torch.float16}


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


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_each_layer_in_its_published_precision_in_the_cuda_recipe(name, monkeypatch):
    monkeypatch.setattr(torch, 'compile', lambda function, **kwargs: function)  # built, not run
    script = load_script(name)
    net = script.build_net(script.hyp['net'], 10, META, 'fp16')
    assert recipe_dtypes_held(net, name)
    norm = next(module for module in net.modules() if isinstance(module, nn.BatchNorm2d))
    assert norm.running_var.dtype == BATCHNORM_DTYPES[name]  # buffers counted, not only weights
    other = torch.float32 if BATCHNORM_DTYPES[name] == torch.float16 else torch.float16
    norm.to(other)  # the control: one BatchNorm in the other precision is seen
    assert not recipe_dtypes_held(net, name)


@pytest.mark.parametrize('whiten', [True, False])
def test_whole_training_step_on_the_meta_device_in_the_cuda_recipe(paper_script, monkeypatch,
                                                                   whiten):
    script = paper_script
    # Inductor generates no code for the meta device; aot_eager traces the same graphs (forward
    # and backward, through dynamo and AOTAutograd) and runs them with ATen's operators
    compile_with_backend(monkeypatch, 'aot_eager')
    net = script.build_net(script.hyp['net'], 10, META, 'fp16')
    script.reinitialize(net, whiten=whiten, identity_init=whiten)  # off: the paper's ablations
    expected = recipe_dtypes(net, script.__name__)
    assert recipe_dtypes_held(net, script.__name__)
    assert net[2].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    opt = script.hyp['opt']
    groups = script.decoupled_sgd_groups(net, opt['lr'], opt['weight_decay'], opt['momentum'], 16,
                                         opt['bias_scaler'])
    optimizer = torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)
    lookahead = script.LookaheadState(net)
    inputs = torch.empty(16, 3, 32, 32, device=META, dtype=torch.float16)
    labels = torch.empty(16, device=META, dtype=torch.int64)
    autocast = torch.autocast('cuda', enabled=False)  # as train() builds it for 'fp16'
    outputs = net(inputs.contiguous(memory_format=torch.channels_last))
    loss = F.cross_entropy(outputs.float(), labels, label_smoothing=0.2, reduction='sum')
    loss.backward()
    optimizer.step()
    lookahead.update(net, decay=0.5)
    assert outputs.dtype == torch.float16 and loss.dtype == torch.float32
    grads = {name: p.grad.dtype for name, p in net.named_parameters() if p.requires_grad}
    assert grads == {name: dtype for name, dtype in expected.items() if name in grads}
    assert set(grads) == {n for n, p in net.named_parameters() if p.requires_grad} and grads
    assert ('0.weight' in grads) == (not whiten)  # without whitening the first conv is trained
    assert recipe_dtypes_held(net, script.__name__)  # kept by the step
    logits = script.infer(net, torch.empty(10, 3, 32, 32, device=META, dtype=torch.float16), 2,
                          autocast, batch_size=4)
    assert logits.shape == (10, 10) and logits.dtype == torch.float32 and logits.device == META
    with pytest.raises(RuntimeError):  # the control: a CPU tensor mixed in raises
        net(torch.zeros(2, 3, 32, 32, dtype=torch.float16))


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


@needs_fake_cuda
def test_loader_whitening_lookahead_and_tta_on_fake_cuda(ab94):
    mode = FakeTensorMode()
    net = fake_cuda(ab94.build_net(ab94.hyp['net'], 10, CPU, 'fp16'), mode)
    hyp = with_hyp(ab94.hyp, aug__cutout=8)  # every augmentation on
    with mode:
        images = torch.empty(300, 32, 32, 3, dtype=torch.uint8, device=FAKE_CUDA)
        labels = torch.empty(300, dtype=torch.int64, device=FAKE_CUDA)
        for sampling in ('reshuffle', 'replacement'):
            loader = ab94.CifarLoader(images, labels, 64, (0.5,) * 3, (0.25,) * 3, hyp['aug'],
                                      torch.float16, sampling=sampling)
            for flip in ('alternating', 'random'):
                loader.aug['flip'] = flip
                for _ in range(2):  # the first epoch (flip, pad) and a later one
                    batches = list(loader)
                    assert len(batches) == 4 and batches[0][0].shape == (64, 3, 32, 32)
                    assert {b.device.type for batch in batches for b in batch} == {'cuda'}
        ab94.init_whitening(net[0], loader.normalize(loader.images[:200]), 5e-4)
        lookahead = ab94.LookaheadState(net)
        lookahead.update(net, decay=0.3)
        logits = ab94.infer(net, loader.normalize(loader.images), 2,
                            torch.autocast('cuda', enabled=False))
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


class HostSyncRecorder(TorchDispatchMode):
    """Records the operators that make the host wait for the device (scalars read back,
    data-dependent shapes; with linalg, also LINALG_SYNCS) while `timed` is set, and all operators
    seen."""

    def __init__(self, linalg=False):
        super().__init__()
        self.timed, self.timed_syncs, self.untimed_syncs, self.ops = False, [], [], set()
        self.syncs = HOST_SYNCS | LINALG_SYNCS if linalg else HOST_SYNCS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        bool_index = func is torch.ops.aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1])
        if func in self.syncs or bool_index:
            (self.timed_syncs if self.timed else self.untimed_syncs).append(str(func))
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


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


def timed_region_tracker(module, recorder):
    """A stand-in for module.time whose perf_counter() alternately opens and closes the timed
    region: train() calls it in pairs around each timed part."""
    def perf_counter():
        recorder.timed = not recorder.timed
        return real_perf_counter()
    real_perf_counter = module.time.perf_counter
    return types.SimpleNamespace(perf_counter=perf_counter)


def recorded_train(module, monkeypatch, hyp, precision):
    """module.train() on tiny_dataset() under a HostSyncRecorder whose timed region opens and
    closes at each read of the script's clock: (the recorder, train's result)."""
    recorder = HostSyncRecorder()
    monkeypatch.setattr(module, 'time', timed_region_tracker(module, recorder))
    with recorder:
        result = module.train(tiny_dataset(), hyp, CPU, precision, seed=0)
    return recorder, result


# The paper's ablations, all at once; their run is shorter, and in fp32, the faster on a CPU
ABLATIONS = dict(net__whiten=False, net__identity_init=False, opt__lookahead_every=0,
                 opt__sampling='replacement', opt__bias_scaler=1.0, opt__train_epochs=1.5)


@pytest.mark.parametrize('ablations, precision, steps', [
    pytest.param({}, 'fp16', 14, marks=needs_cpu_fp16_padding), (ABLATIONS, 'fp32', 6)])
def test_no_host_synchronization_inside_the_timed_region(ab94, monkeypatch, ablations, precision,
                                                         steps):
    hyp = with_hyp(ab94.hyp, **{'opt__batch_size': 16, 'opt__train_epochs': 3.5, 'aug__cutout': 8,
                                'aug__translate': 2, 'net__widths': NARROW_WIDTHS, **ablations})
    recorder, result = recorded_train(ab94, monkeypatch, hyp, precision)
    assert not recorder.timed  # the timed regions all closed
    assert result['steps'] == steps and 'aten.convolution_backward.default' in recorder.ops
    assert recorder.timed_syncs == []
    # The control: the untimed per-epoch figures do read scalars back, and are seen
    assert 'aten._local_scalar_dense.default' in recorder.untimed_syncs


def test_the_recorder_sees_a_synchronization_in_the_timed_region(ab94, monkeypatch):
    recorder = HostSyncRecorder()
    monkeypatch.setattr(ab94, 'time', timed_region_tracker(ab94, recorder))
    original = ab94.lookahead_decay
    monkeypatch.setattr(ab94, 'lookahead_decay',  # a timed-loop bug: a value read back each update
                        lambda step, total: original(step, total) + 0 * torch.ones(1).item())
    with recorder:
        ab94.train(tiny_dataset(), with_hyp(ab94.hyp, opt__batch_size=16, opt__train_epochs=3),
                   CPU, 'fp32', seed=0)
    assert 'aten._local_scalar_dense.default' in recorder.timed_syncs


def test_compiled_infer_keeps_outputs_that_the_next_call_overwrites():
    """CUDA graphs (max-autotune) return the graph's own output buffer, overwritten by the next
    call; in fp32, .float() returns that same buffer. Simulated: a network with one output buffer."""
    compiled, eager = load_script('airbench94_compiled'), load_script('airbench94')

    class OneOutputBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = torch.zeros(4, 10)

        def forward(self, x):
            return self.out.copy_(x.mean((2, 3)).repeat(1, 4)[:, :10])

    images = torch.randn(12, 3, 32, 32)
    expected = images.mean((2, 3)).repeat(1, 4)[:, :10]
    autocast = torch.autocast('cpu', enabled=False)
    logits = compiled.infer(OneOutputBuffer(), images, 0, autocast, batch_size=4)
    assert torch.equal(logits, expected)
    # The control: without the clone every batch's logits are the last batch's
    wrong = eager.infer(OneOutputBuffer(), images, 0, autocast, batch_size=4)
    assert not torch.equal(wrong, expected) and torch.equal(wrong[:4], expected[8:])


DEVICE_CLOCK_SCRIPTS = ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']


def train_as_on_cuda(script, monkeypatch, recorder, precision, on_epoch=None, **clock):
    """train() on the CPU along its CUDA path: compiled (the recording backend's graphs run their
    ATen operators, which the recorder sees; airbench94_compiled compiles on every device), timed
    by the queued clock; a small network on two classes, 4 steps in each of 3.5 epochs."""
    compile_with_backend(monkeypatch, 'aot_eager')
    monkeypatch.setattr(script, 'compiles', lambda device: True, raising=False)
    clock_class = queued_clock(script, recorder)
    monkeypatch.setattr(script, 'DeviceClock', lambda device: clock_class(device, **clock))
    hyp = with_hyp(script.hyp, opt__batch_size=16, opt__train_epochs=3.5,
                   net__widths=NARROW_WIDTHS)
    torch._dynamo.reset()
    return script.train(tiny_dataset(), hyp, CPU, precision, seed=0, on_epoch=on_epoch)


@pytest.mark.parametrize('name', DEVICE_CLOCK_SCRIPTS)
@pytest.mark.parametrize('precision', [  # fp16 on the CPU: slower, and the same operators
    pytest.param('fp16', marks=[needs_cpu_fp16_padding, pytest.mark.slow]), 'fp32'])
def test_one_timed_window_without_host_synchronization_as_on_cuda(name, precision, monkeypatch):
    """From the whitening init to the test predictions the host never waits for the device but
    where the whitening's eigendecomposition checks its solver (as the published scripts' SVD,
    before any training work is queued); every figure is read after the window: the per-epoch
    ones, then passed to on_epoch, and the TTA accuracy."""
    script = load_script(name)
    recorder = HostSyncRecorder(linalg=True)
    seen = []
    with recorder:
        result = train_as_on_cuda(script, monkeypatch, recorder, precision, on_epoch=seen.append)
    assert result['steps'] == 14 and 'aten.convolution_backward.default' in recorder.ops
    assert recorder.timed_syncs == ['aten._linalg_eigh.default']
    assert [figures['epoch'] for figures in seen] == [0, 1, 2, 3]
    # The per-epoch figures' and the TTA accuracy's reads, after the window
    assert recorder.untimed_syncs.count('aten._local_scalar_dense.default') == 4 * 3 + 1


@pytest.mark.parametrize('name', [  # the others' controls: the slow tier
    *[pytest.param(name, marks=pytest.mark.slow) for name in DEVICE_CLOCK_SCRIPTS[:-1]],
    DEVICE_CLOCK_SCRIPTS[-1]])
def test_the_window_shows_a_synchronization_in_a_step_or_figures_read_as_they_come(
        name, monkeypatch):
    """The controls: a loss read back in each step, and the CPU path's per-epoch reads (right
    there: the CPU queues nothing) on CUDA's clock, are seen inside the window."""
    script = load_script(name)
    recorder = HostSyncRecorder()
    original = script.with_loss

    def reading_loss(forward):  # the loss read back: a graph break, and the host waits
        def forward_and_loss(*args):
            outputs = original(forward)(*args)
            return outputs if len(args) == 1 else (outputs[0], outputs[1] + 0 * outputs[1].item())
        return forward_and_loss
    monkeypatch.setattr(script, 'with_loss', reading_loss)
    with recorder:
        train_as_on_cuda(script, monkeypatch, recorder, 'fp32')
    assert recorder.timed_syncs.count('aten._local_scalar_dense.default') >= 14  # every step
    monkeypatch.undo()
    script = load_script(name)
    recorder = HostSyncRecorder()
    with recorder:
        train_as_on_cuda(script, monkeypatch, recorder, 'fp32', on_epoch=lambda figures: None,
                         queued=False)
    assert recorder.timed_syncs.count('aten._local_scalar_dense.default') >= 3 * 3


@pytest.mark.parametrize('name', DEVICE_CLOCK_SCRIPTS)
def test_the_network_compiles_in_the_hyp_mode_on_cuda_and_the_default_on_the_cpu(name, monkeypatch):
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
