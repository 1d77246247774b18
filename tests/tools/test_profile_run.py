"""tools/profile_run.py: the CPU count on a toy run whose counts are known by construction (and a
host synchronization put in its timed window, counted), the arithmetic of a CUDA trace on
synthetic Chrome traces as kineto writes them (kinds, idle time, CUDA-graph launches and the
kernels they replayed, the figures declared incomplete where a graph's kernels are missing,
launches per step, CPU time, FLOP fraction), a real CPU profile read back from its Chrome trace,
bad input refused in one line; slow: the count of airbench94_hiverge itself, and of a stand-in
published script run through the published scripts' path."""
import contextlib
import json
import subprocess
import sys

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


def trace_event(name, cat, start, end, **args):
    """A complete event as kineto writes it into a Chrome trace: times in microseconds (here
    given in ms), its ids in args ('External id': external=, CUPTI's correlation=, a graph's
    node: graph_id=, graph_node_id=)."""
    renamed = {'external': 'External id', 'graph_id': 'graph id', 'graph_node_id': 'graph node id'}
    return {'ph': 'X', 'cat': cat, 'name': name, 'pid': 0 if 'gpu' in cat or cat == 'kernel'
            else 4242, 'tid': 7, 'ts': start * 1000.0, 'dur': (end - start) * 1000.0,
            'args': {renamed.get(key, key): value for key, value in args.items()}}


def flow(name, correlation, start, kernel_start):
    """A flow arrow from a host call to a GPU activity, as kineto draws them (the tool reads the
    correlation ids instead)."""
    return [{'ph': 's', 'cat': name, 'name': name, 'id': correlation, 'pid': 4242, 'tid': 7,
             'ts': start * 1000.0},
            {'ph': 'f', 'bp': 'e', 'cat': name, 'name': name, 'id': correlation, 'pid': 0,
             'tid': 7, 'ts': kernel_start * 1000.0}]


# A timed window from 100 to 1000 ms of 2 steps: an eager cuDNN convolution (cudaLaunchKernel), a
# Triton kernel inside its launcher's CPU range of the same name (cuLaunchKernel), two CUDA-graph
# launches each replaying two activities under its own correlation id (one overlaps the other
# graph's memset), a kernel linked by its operator only, one linked to nothing, one launched after
# the window, a range mirrored on the GPU, and an operator before the window whose External id is
# the convolution's correlation id (another id space)
HOST = [trace_event('aten::addmm', 'cpu_op', 50, 60, external=1),
        trace_event('airbench: timed start', 'user_annotation', 100, 100, external=2),
        trace_event('airbench: whitening', 'user_annotation', 105, 115, external=3),
        trace_event('airbench: optimizer', 'user_annotation', 120, 140, external=4),
        trace_event('cudaLaunchKernel', 'cuda_runtime', 150, 151, correlation=1, external=4),
        trace_event('triton_poi_fused_add_0', 'cpu_op', 159, 162, external=5),
        trace_event('cuLaunchKernel', 'cuda_driver', 160, 161, correlation=2, external=5),
        trace_event('Torch-Compiled Region: 0/0', 'user_annotation', 165, 175, external=6),
        trace_event('cudaGraphLaunch', 'cuda_runtime', 170, 172, correlation=3, external=6),
        trace_event('Torch-Compiled Region: 1/0', 'user_annotation', 176, 185, external=7),
        trace_event('cudaGraphLaunch', 'cuda_runtime', 180, 182, correlation=8, external=7),
        trace_event('Optimizer.step#SGD.step', 'user_annotation', 190, 200, external=9),
        trace_event('aten::mm', 'cpu_op', 500, 510, external=10),
        trace_event('cudaDeviceSynchronize', 'cuda_runtime', 900, 990, correlation=11),
        trace_event('airbench: timed stop', 'user_annotation', 1000, 1000, external=12),
        trace_event('cudaLaunchKernel', 'cuda_runtime', 2000, 2001, correlation=13)]
GPU = [trace_event('sm90_xmma_fprop_implicit_gemm', 'kernel', 200, 300, correlation=1,
                   external=4),
       trace_event('triton_poi_fused_add_0', 'kernel', 310, 330, correlation=2, external=5),
       trace_event('triton_red_fused_sum_1', 'kernel', 400, 450, correlation=3, external=6,
                   graph_id=1, graph_node_id=10),
       trace_event('Memset (Device)', 'gpu_memset', 460, 470, correlation=3, external=6,
                   graph_id=1, graph_node_id=11),
       trace_event('sm90_xmma_fprop_implicit_gemm', 'kernel', 465, 520, correlation=8,
                   external=7, graph_id=2, graph_node_id=20),
       trace_event('triton_red_fused_sum_1', 'kernel', 520, 530, correlation=8, external=7,
                   graph_id=2, graph_node_id=21),
       trace_event('nvjet_hsh_128x256', 'kernel', 600, 700, external=10),
       trace_event('void unlinked_kernel', 'kernel', 800, 810, correlation=99),
       trace_event('triton_poi_fused_mul_2', 'kernel', 2100, 2200, correlation=13),
       trace_event('airbench: optimizer', 'gpu_user_annotation', 120, 140, external=4)]
FLOWS = [arrow for correlation, start, kernel in ((1, 150, 200), (2, 160, 310), (3, 170, 400),
                                                 (3, 170, 460), (8, 180, 465), (8, 180, 520))
         for arrow in flow('ac2g', correlation, start, kernel)] + flow('fwdbwd', 1, 50, 200)
GRAPH_CORRELATIONS = {3, 8}


def trace_of(tmp_path, events):
    """The figures tools/profile_run.py reads from a Chrome trace of these events, 2 steps."""
    path = tmp_path / 'trace.json'
    path.write_text(json.dumps({'schemaVersion': 1, 'traceEvents': events}))
    return profile_run.trace_summary(profile_run.trace_frame(path), steps=2)


def report(summary):
    return profile_run.trace_report('synthetic', summary, 0.9, 'not counted', None, 'a GPU')


def test_trace_figures_of_a_synthetic_run_with_cuda_graphs(tmp_path):
    """Every kernel counts where the host launched it in the window: the graphs' by their
    launches' correlation ids, the Triton kernel although a CPU range has its name."""
    summary = trace_of(tmp_path, HOST + GPU + FLOWS)
    assert summary['windows'] == 1 and summary['gpu_activities'] == 7
    assert summary['unlinked_gpu_activities'] == 1
    assert summary['kernel_ms_by_kind'] == {'matmul/conv': 255, 'triton fused': 80,
                                            'copy/memset': 10, 'other': 0}
    assert summary['calls_by_kind'] == {'matmul/conv': 3, 'triton fused': 3, 'copy/memset': 1,
                                        'other': 0}
    assert summary['gpu_figures_complete'] and summary['gpu_work_missing'] == []
    # busy: 200-300, 310-330, 400-450, 460-530 (a memset and a kernel overlapping), 600-700
    assert (summary['span_ms'], summary['busy_ms'], summary['idle_ms']) == (500, 340, 160)
    assert summary['kernel_launches_per_step'] == 1.0  # 2 in the window, one after it
    assert summary['graph_launches_per_step'] == 1.0 and summary['graph_kernels_per_step'] == 2.0
    assert summary['graph_launches_without_kernels'] == 0
    assert (summary['synchronizations'], summary['waiting_ms']) == (1, 90)
    assert summary['cpu_ms_per_step'] == (900 - 90) / 2
    assert summary['cpu_ms_per_step_inside'] == {'optimizer': 15.0, 'compiled regions': 9.5}
    assert summary['cpu_ms_per_run_inside'] == {'whitening': 10.0}
    lines = report(summary)
    assert lines[1] == ('GPU span 500.0 ms: busy 340.0 ms, idle between kernels 160.0 ms; 7 GPU '
                        'activities (1 in the trace not linked to a launch, left out)')
    assert '1.00 CUDA-graph launches replaying 2.0 kernels, copies and memsets' in lines[3]
    path = tmp_path / 'trace.json'
    frame = profile_run.trace_frame(path)
    table = profile_run.kernel_table(profile_run.gpu_work_in_windows(
        frame, profile_run.frame_windows(frame))[0])
    assert list(table.name[:2]) == ['sm90_xmma_fprop_implicit_gemm', 'nvjet_hsh_128x256']
    assert list(table.calls[:2]) == [2, 1] and table.calls.sum() == 7


@pytest.mark.parametrize('lost, empty', [(GRAPH_CORRELATIONS, 2), ({8}, 1)])
def test_graph_launches_without_their_kernels_make_the_figures_incomplete(tmp_path, lost, empty):
    """As where the profiler did not record what the graphs replayed: their launches are in the
    trace, their kernels are not; busy and idle time are not given, and the report says why."""
    kept = [e for e in GPU if e['args'].get('correlation') not in lost]
    summary = trace_of(tmp_path, HOST + kept)
    assert not summary['gpu_figures_complete']
    assert summary['gpu_work_missing'] == [
        f'{empty} of 2 CUDA-graph launches in the timed windows have no kernel in the trace (the '
        'profiler did not record what they replayed)']
    assert summary['span_ms'] is summary['busy_ms'] is summary['idle_ms'] is None
    assert summary['graph_launches_without_kernels'] == empty
    assert summary['graph_kernels_per_step'] == (2 - empty) * 2 / 2
    lines = report(summary)
    assert lines[1].startswith('GPU busy and idle time: incomplete, not printed: '
                               f'{empty} of 2 CUDA-graph launches')
    assert 'span' not in lines[1] and lines[2].startswith('kernel time by kind (incomplete): ')


def test_activities_linked_to_no_launch_inside_the_span_make_the_figures_incomplete(tmp_path):
    moved = [trace_event('void unlinked_kernel', 'kernel', 480, 490, correlation=99)]
    summary = trace_of(tmp_path, HOST + GPU[:7] + moved)
    assert summary['gpu_work_missing'] == ['1 GPU activities inside the span are linked to no '
                                           'launch']
    assert summary['busy_ms'] is None


def test_trace_times_are_read_exactly(tmp_path):
    """Kineto writes microseconds with 3 decimals, since the epoch in older torch: nanoseconds
    that a float would round."""
    path = tmp_path / 'trace.json'
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", '
                    '"ts": 1764288000123456.789, "dur": 0.003, "args": {"correlation": 5}}]}')
    frame = profile_run.trace_frame(path)
    assert (frame.start[0], frame.end[0]) == (1764288000123456789, 1764288000123456792)
    assert frame.correlation[0] == 5 and frame.external[0] == 0


def test_a_real_cpu_profile_reads_back_from_its_chrome_trace(tmp_path):
    """The markers and ranges as this torch exports them: one window, its whitening range, its
    operators on the host."""
    recorder = profile_run.Recorder()

    def run():
        recorder.toggle()
        with profile_run.record_function(profile_run.LABEL + 'whitening'):
            torch.ones(4, 4).mm(torch.ones(4, 4))
        recorder.toggle()
    _, prof = profile_run.profiled(recorder, run, [profile_run.ProfilerActivity.CPU])
    frame = profile_run.exported_frame(prof, str(tmp_path))
    assert (tmp_path / 'trace.json').exists()
    summary = profile_run.trace_summary(frame, steps=1)
    assert summary['windows'] == 1 and set(summary['cpu_ms_per_run_inside']) == {'whitening'}
    assert 'aten::mm' in set(frame.name[frame.activity == 'cpu_op'])
    assert summary['gpu_activities'] == 0 and summary['graph_launches_per_step'] == 0


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
    (['trace', 'airbench94', '--peak-tflops', 'x'], 'a positive number'),
    (['trace', 'airbench94', '--chrome-trace'], '--chrome-trace writes OUT/trace.json')])
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
