"""tools/profile_run.py: the CPU count on a toy run whose counts are known by construction (and a
host synchronization put in its timed window, counted), the arithmetic of a CUDA trace on
synthetic kernel events (kinds, idle time, launches per step, CPU time, FLOP fraction), its bad
input refused in one line; slow: the count of airbench94_hiverge itself, and of a stand-in
published script run through the published scripts' path."""
import contextlib
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from conftest import REPO, load_tool

profile_run = load_tool('profile_run')

TOY = '''
import torch
import torch.nn.functional as F

class CifarLoader:
    def __init__(self, images, labels, batch_size):
        self.images, self.labels, self.batch_size = images, labels, batch_size

    def __iter__(self):
        order = torch.randperm(len(self.images))          # an operator per epoch
        for batch in order.split(self.batch_size):        # views: none
            yield self.images[batch], self.labels[batch]  # two per batch

class LookaheadState:
    def __init__(self, weight):
        self.weight = weight.clone()

    def update(self, weight):
        self.weight.lerp_(weight, 0.5)                    # one per step, the optimizer's

def init_whitening(weight):
    weight.mul_(2)                                        # one per run

def infer(net, images):
    return net(images).clone()                            # a graph call and an operator per run

def train(net, images, labels, clock, read_back):
    """Three timed windows: the whitening, 2 epochs of 4 steps, the evaluation."""
    loader, weight, steps = CifarLoader(images, labels, 4), torch.ones(3), 0
    start = clock.perf_counter()
    init_whitening(weight)
    clock.perf_counter()
    lookahead = LookaheadState(weight)
    with torch.no_grad():
        clock.perf_counter()
        for epoch in range(2):
            for inputs, targets in loader:
                outputs = net(inputs)                     # a graph call per step
                loss = F.cross_entropy(outputs, targets)  # one operator, the loss's
                outputs.add_(1)                           # one, other
                outputs.view(-1), torch.empty(3)          # a view and an allocation: none
                lookahead.update(outputs[0])
                steps += 1
            if read_back:                                 # the control: a host sync per epoch
                loss.item()
        clock.perf_counter()
        loss.item()                                       # untimed
        clock.perf_counter()
        infer(net, images)
        clock.perf_counter()
    return steps
'''


def count_toy(read_back):
    """The toy's train() counted as the tool counts a script: compiled with the counting backend,
    warmed up once, then profiled."""
    torch._dynamo.reset()
    recorder, namespace = profile_run.Recorder(), {}
    exec(compile(TOY, 'toy', 'exec'), namespace)
    images, labels = torch.randn(16, 3), torch.arange(16) % 3
    with profile_run.as_on_cuda(recorder), contextlib.ExitStack() as stack:
        profile_run.label_script(stack, namespace, recorder)
        profile_run.label_torch(stack)
        net = torch.compile(lambda x: (x * 2 + 1).relu(), dynamic=False)
        namespace['train'](net, images, labels, recorder.clock(), False)  # the warmup
        steps, prof = profile_run.profiled(recorder, lambda: namespace['train'](
            net, images, labels, recorder.clock(), read_back), [profile_run.ProfilerActivity.CPU])
    tally = profile_run.count_events(prof.events())
    return profile_run.count_summary('toy', tally, steps, recorder)


def test_the_count_of_a_toy_run_is_known_by_construction():
    counts = count_toy(read_back=False)
    assert counts['steps'] == counts['batches_timed'] == 8
    # per step: the loader's 2 + 2 randperms over 8 steps, the loss 1, other 1, the optimizer 1
    assert counts['eager_ops_per_step_by_source'] == {'optimizer': 1.0, 'loss': 1.0,
                                                      'loader': 2.25, 'other': 1.0}
    assert counts['eager_ops_per_step'] == 5.25 and counts['graph_calls_per_step'] == 1.0
    assert counts['eager_ops_per_run'] == {'whitening': 1, 'evaluation': 1}
    assert counts['graph_calls_per_run'] == {'whitening': 0, 'evaluation': 1}
    assert counts['timing_windows'] == 3
    assert counts['host_syncs_timed'] == 0 and counts['host_syncs_untimed'] == 1
    # the step's graph and the evaluation's (another shape, static: a recompile), in the warmup
    assert (counts['graphs_compiled'], counts['graphs_compiled_in_run'],
            counts['recompiles']) == (2, 0, 1)
    assert torch.compile is profile_run.ORIGINAL['compile']  # the stand-ins are undone


def test_a_value_read_back_in_the_timed_window_is_a_host_sync():
    counts = count_toy(read_back=True)
    assert counts['host_syncs_timed'] == 2  # one per epoch
    assert counts['host_syncs_timed_by_source'] == {'other': 2}
    assert counts['host_syncs_timed_by_operator'] == {'aten::_local_scalar_dense': 2}
    assert counts['eager_ops_per_step'] == 5.25  # a read is no kernel of its own


def test_backward_operators_count_where_their_forward_came_from():
    """Eager autograd: the cross-entropy and its two backward nodes' operators are the loss's;
    the scaling, its backward and the backward's seed other."""
    recorder, x = profile_run.Recorder(), torch.randn(4, 3, requires_grad=True)
    with contextlib.ExitStack() as stack:
        profile_run.label_torch(stack)

        def step():
            recorder.toggle()
            loss = torch.nn.functional.cross_entropy(x * 2, torch.tensor([0, 1, 2, 0]))
            loss.backward()
            recorder.toggle()
        _, prof = profile_run.profiled(recorder, step, [profile_run.ProfilerActivity.CPU])
    tally = profile_run.count_events(prof.events())
    assert dict(tally['eager_ops']) == {('loss', True): 3, ('other', True): 3}
    assert x.grad is not None


@pytest.mark.parametrize('name, work', [
    ('aten::view', False), ('aten::t', False), ('aten::split', False), ('aten::expand', False),
    ('aten::empty', False), ('aten::empty_strided', False), ('aten::_local_scalar_dense', False),
    ('aten::item', False), ('aten::to', False), ('aten::contiguous', False),
    ('aten::add_', True), ('aten::copy_', True), ('aten::mm', True), ('aten::_to_copy', True),
    ('aten::_foreach_add_', True), ('aten::nonzero', True), ('aten::randperm', True)])
def test_operators_that_do_no_work_of_their_own(name, work):
    """Views, allocations and scalar reads launch nothing; to and contiguous only through the
    copy they call where they copy."""
    assert profile_run.launches_no_kernel(name) == (not work)


@pytest.mark.parametrize('name, activity, kind', [
    ('sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64',
     'kernel', 'matmul/conv'),
    ('cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimized_f16_256x64>',
     'kernel', 'matmul/conv'),
    ('sm90_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32',
     'kernel', 'matmul/conv'),
    ('nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTT', 'kernel', 'matmul/conv'),
    ('triton_tem_fused_convolution_0', 'kernel', 'matmul/conv'),
    ('triton_poi_fused__to_copy_add_0', 'kernel', 'triton fused'),
    ('triton_red_fused_max_pool2d_with_indices_backward_native_batch_norm_backward_3', 'kernel',
     'triton fused'),
    ('triton_per_fused_native_batch_norm_1', 'kernel', 'triton fused'),
    ('Memcpy HtoD (Pageable -> Device)', 'gpu_memcpy', 'copy/memset'),
    ('Memset (Device)', 'gpu_memset', 'copy/memset'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<'
     'at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)', 'kernel', 'copy/memset'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>>',
     'kernel', 'copy/memset'),
    ('void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half, float, int, 512, true, 1, true>', 'kernel',
     'other'),
    ('void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::Half, float>',
     'kernel', 'other')])
def test_kernel_kinds_from_their_names(name, activity, kind):
    assert profile_run.kernel_kind(name, activity) == kind


def test_busy_and_idle_time_of_overlapping_kernels():
    assert profile_run.busy_and_idle([(0, 10), (5, 12), (20, 30), (40, 41)]) == (41, 23, 18)
    assert profile_run.busy_and_idle([(3, 9), (4, 5)]) == (6, 6, 0)  # one inside another
    assert profile_run.busy_and_idle([]) == (0, 0, 0)


MS = 1_000_000  # ns


def synthetic_trace():
    """A run's events as the trace's frame holds them: a timed window from 100 to 1000 ms, its
    launches (by flow id, by the CPU operator they belong to, one linked to nothing), a CUDA
    graph's two kernels, a launch after the window, a synchronization, ranges (one mirrored on
    the GPU) and an operator before the window whose flow id (of another kind) a kernel's
    shares."""
    cpu = [('aten::addmm', 'cpu_op', 50, 60, 14, 0, 1),  # a flow of another kind (fwdbwd)
           ('airbench: timed start', 'user_annotation', 100, 100, 1, 0, 0),
           ('airbench: whitening', 'user_annotation', 105, 115, 13, 0, 0),
           ('airbench: optimizer', 'user_annotation', 120, 140, 2, 0, 0),
           ('cudaLaunchKernel', 'cuda_runtime', 150, 151, 3, 20, 1),
           ('cudaLaunchKernel', 'cuda_runtime', 160, 161, 4, 20, 2),
           ('Torch-Compiled Region: 0/0', 'user_annotation', 165, 175, 5, 0, 0),
           ('cudaGraphLaunch', 'cuda_runtime', 170, 172, 6, 5, 4),
           ('Optimizer.step#SGD.step', 'user_annotation', 180, 190, 7, 0, 0),
           ('aten::mm', 'cpu_op', 500, 510, 77, 0, 0),
           ('cudaDeviceSynchronize', 'cuda_runtime', 900, 990, 8, 0, 0),
           ('airbench: timed stop', 'user_annotation', 1000, 1000, 9, 0, 0),
           ('cudaLaunchKernel', 'cuda_runtime', 2000, 2001, 10, 0, 3)]
    gpu = [('sm90_xmma_fprop_implicit_gemm', 'kernel', 200, 300, 1, 20, 1),
           ('triton_poi_fused_add_0', 'kernel', 310, 330, 2, 20, 2),
           ('triton_red_fused_sum_1', 'kernel', 400, 450, 4, 5, 4),
           ('Memset (Device)', 'gpu_memset', 460, 470, 4, 5, 4),
           ('nvjet_hsh_128x256', 'kernel', 600, 700, 11, 77, 0),
           ('triton_poi_fused_mul_2', 'kernel', 2100, 2200, 3, 0, 3),  # launched after the window
           ('void unlinked_kernel', 'kernel', 800, 810, 12, 0, 0),
           ('airbench: optimizer', 'gpu_user_annotation', 120, 140, 15, 2, 0)]  # not work
    rows = [dict(name=n, device=d, activity=a, start=s * MS, end=e * MS, correlation=c,
                 linked=link, flow=f) for d, events in (('cpu', cpu), ('cuda', gpu))
            for n, a, s, e, c, link, f in events]
    return pd.DataFrame(rows)


def test_trace_figures_of_a_synthetic_run():
    summary = profile_run.trace_summary(synthetic_trace(), steps=2)
    assert summary['windows'] == 1 and summary['gpu_activities'] == 5
    assert summary['unlinked_gpu_activities'] == 1
    assert summary['kernel_ms_by_kind'] == {'matmul/conv': 200, 'triton fused': 70,
                                            'copy/memset': 10, 'other': 0}
    assert (summary['span_ms'], summary['busy_ms'], summary['idle_ms']) == (500, 280, 220)
    assert summary['kernel_launches_per_step'] == 1.0  # 2 in the window, one after it
    assert summary['graph_launches_per_step'] == 0.5
    assert (summary['synchronizations'], summary['waiting_ms']) == (1, 90)
    assert summary['cpu_ms_per_step'] == (900 - 90) / 2
    assert summary['cpu_ms_per_step_inside'] == {'optimizer': 15.0, 'compiled regions': 5.0}
    assert summary['cpu_ms_per_run_inside'] == {'whitening': 10.0}
    table = profile_run.kernel_table(profile_run.gpu_work_in_windows(
        synthetic_trace(), [(100 * MS, 1000 * MS)])[0])
    assert list(table.name[:2]) == ['nvjet_hsh_128x256', 'sm90_xmma_fprop_implicit_gemm']
    assert table.calls.sum() == 5


def test_flop_fraction_and_the_peaks_of_known_gpus():
    achieved, fraction = profile_run.flop_fraction(0.263e15, 1.232, 989)
    assert round(achieved) == 213 and round(100 * fraction, 1) == 21.6  # the GPU record's run
    names = {'NVIDIA H100 80GB HBM3': 989, 'NVIDIA H100 PCIe': 756, 'NVIDIA H200': 989,
             'NVIDIA A100-SXM4-80GB': 312, 'NVIDIA L4': 121, 'NVIDIA L40S': 362,
             'Some Future GPU': None}
    assert {name: profile_run.peak_tflops(name) for name in names} == names
    assert profile_run.peak_tflops('Some Future GPU', 500.0) == 500.0


def test_windows_pair_up_and_steps_divide():
    assert profile_run.timed_windows([(5, False), (1, True), (9, True), (12, False)]) == \
        [(1, 5), (9, 12)]
    assert profile_run.in_windows(4, [(1, 5), (9, 12)]) and \
        not profile_run.in_windows(6, [(1, 5), (9, 12)])
    with pytest.raises(ValueError, match='do not pair up'):
        profile_run.timed_windows([(1, True), (2, True), (3, False)])
    with pytest.raises(ValueError, match='no training step'):
        profile_run.per_step(10, 0)


@pytest.mark.parametrize('argv, message', [
    (['count', 'airbench_nonexistent'], 'neither one of ours'),
    (['count', 'airbench94', '--widths', '2,8'], 'three positive widths'),
    (['count', 'airbench94', '--batch-size', '0'], 'a positive number'),
    (['trace', 'airbench94', '--peak-tflops', 'x'], 'a positive number')])
def test_bad_input_is_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        profile_run.main(argv)
    error = f'{stopped.value.code}' if isinstance(stopped.value.code, str) else \
        capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error and 'Traceback' not in error


def test_a_failed_count_names_the_error_not_the_profilers_log():
    stderr = ('Traceback (most recent call last):\nValueError: no batch\n'
              'USDT:2026-11-27 11:05:56 19361:19361 SyncActivityProfilerHandler.cpp:46] stop\n'
              'ERROR:2026-11-27 11:05:56 19361:19361 DeviceProperties.cpp:56] gpuGetDeviceCount\n')
    assert profile_run.last_message(stderr) == 'ValueError: no batch'
    assert profile_run.last_message('') == '(no message)'


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_trace_without_a_gpu_says_so():
    with pytest.raises(SystemExit, match='trace on CUDA needs a GPU'):
        profile_run.main(['trace', 'airbench94_hiverge'])


def count_command(tmp_path, *argv):
    """`profile_run.py count ... --out DIR`: its output and the counts it wrote."""
    done = subprocess.run([sys.executable, f'{REPO}/tools/profile_run.py', 'count', *argv,
                           '--out', str(tmp_path / 'out')], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads((tmp_path / 'out' / 'counts.json').read_text())


@pytest.mark.slow
def test_the_count_of_airbench94_hiverge_is_consistent(tmp_path):
    """One epoch (32 steps) counted as on CUDA: per step a forward with its loss, a backward and
    Muon's whole step, each a graph, and per epoch the augmentation's; fewer eager operators per
    step than the published script's 13.17 (docs/cpu.md); no graph compiled when timed
    (test_hiverge.py's warmup check); one timed window, and in it one host synchronization: the
    whitening's eigh, which checks its result (inside the operator: test_cuda_path.py's
    dispatch-level recorder sees no operator that syncs)."""
    stdout, (counts,) = count_command(tmp_path, 'airbench94_hiverge', '--epochs', '1')
    assert counts['steps'] == counts['batches_timed'] == 32
    by_source = counts['eager_ops_per_step_by_source']
    assert counts['eager_ops_per_step'] == pytest.approx(sum(by_source.values()))
    assert by_source['loss'] == 0  # in the network's graph
    assert 0 < by_source['optimizer'] < 3 and by_source['loader'] > 2
    assert counts['eager_ops_per_step'] < 13.17
    assert counts['graph_calls_per_step'] == pytest.approx(3 + 1 / 32)
    assert counts['graphs_compiled'] > 0 and counts['graphs_compiled_in_run'] == 0
    assert counts['host_syncs_timed_by_source'] == {'whitening': 1}
    assert counts['timing_windows'] == 1
    assert '| airbench94_hiverge | 32 |' in stdout


STAND_IN = '''
import os
from math import ceil
import torch
import torch.nn.functional as F
from torch import nn

class CifarLoader:
    def __init__(self, path, train=True, batch_size=500):
        data = torch.load(os.path.join(path, 'train.pt' if train else 'test.pt'),
                          map_location=torch.device('cuda'))
        self.images = (data['images'][:, :4, :4].half() / 255).flatten(1)
        self.labels, self.batch_size = data['labels'], batch_size

    def __len__(self):
        return len(self.images) // self.batch_size

    def __iter__(self):
        indices = torch.randperm(len(self.images), device='cuda')
        for i in range(len(self)):
            idxs = indices[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.images[idxs], self.labels[idxs]

def print_training_details(variables, is_final_entry):
    print({key: variables.get(key) for key in ('run', 'time_seconds', 'tta_val_acc')})

def evaluate(model, loader):
    with torch.no_grad():
        return (model(loader.images).argmax(1) == loader.labels).float().mean().item()

def main(run, model):
    batch_size = 10000
    widths = dict(block1=64, block2=256, block3=256)  # what --widths sets (unused here)
    train_loader = CifarLoader('cifar10', True, batch_size)
    test_loader = CifarLoader('cifar10', False, 100)
    total_train_steps = ceil(2 * len(train_loader))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True,
                                fused=True)
    starter, ender = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    starter.record()
    step = 0
    for epoch in range(ceil(total_train_steps / len(train_loader))):
        for inputs, labels in train_loader:
            F.cross_entropy(model(inputs).float(), labels, reduction='sum').backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
    tta_val_acc = evaluate(model, test_loader)
    ender.record()
    torch.cuda.synchronize()
    time_seconds = 1e-3 * starter.elapsed_time(ender)
    print_training_details(locals(), is_final_entry=True)
    return tta_val_acc

if __name__ == '__main__':
    model = nn.Linear(48, 10, bias=False).cuda().half()
    model.compile(mode='max-autotune')
    main('warmup', model)
    for run in range(25):
        main(run, model)
'''


@pytest.mark.slow
def test_the_count_of_a_published_script_through_its_main_block(tmp_path):
    """A stand-in written as the published scripts are (CUDA-only, a compiled model, fused SGD,
    CUDA events, a warmup run): its batch of 10000 becomes 4 (5 steps per epoch as at 10000), 2
    epochs; per step its loader's 2 + 1 per epoch, the loss (cross_entropy and its 2 backward
    operators), the optimizer's fused SGD, and the forward's cast, the backward's seed and the
    cast's backward; 2 graph calls (forward, backward); the evaluation's 4 operators and its
    .item(), the one host sync in the one timed window."""
    script = tmp_path / 'stand_in_published.py'
    script.write_text(STAND_IN)
    _, (counts,) = count_command(tmp_path, str(script), '--batch-size', '4', '--test-images', '100')
    assert counts['steps'] == 10
    assert counts['eager_ops_per_step_by_source'] == {'optimizer': 1.0, 'loss': 3.0,
                                                      'loader': 2.2, 'other': 3.0}
    assert counts['graph_calls_per_step'] == 2.0
    assert counts['eager_ops_per_run'] == {'whitening': 0, 'evaluation': 4}
    assert counts['host_syncs_timed_by_source'] == {'evaluation': 1}
    assert counts['timing_windows'] == 1 and counts['graphs_compiled_in_run'] == 0
