"""tools/profile_run.py: synthetic Chrome traces as kineto writes them (CUDA-graph launches, busy
and idle time, incomplete figures), a CPU profile of airbench94; slow: the command line."""
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

from conftest import REPO, write_image_folder

import profile_run

TINY = ['--device', 'cpu', '--epochs', '1', '--hyp', 'opt.batch_size=32',
        '--hyp', "net.widths={'block1': 8, 'block2': 16, 'block3': 16}"]


def test_kernel_kinds_from_their_names():  # those of names the synthetic trace below lacks
    kinds = {('Memcpy HtoD (Pageable -> Device)', 'gpu_memcpy'): 'copy/memset',
             ('triton_tem_fused_convolution_0', 'kernel'): 'matmul/conv',
             ('void at::native::elementwise_kernel<4, FillFunctor<c10::Half>>', 'kernel'):
             'copy/memset', ('void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half>', 'kernel'): 'other'}
    assert {key: profile_run.kernel_kind(*key) for key in kinds} == kinds


def test_busy_and_idle_time_of_overlapping_kernels():
    def figures(intervals):
        return profile_run.busy_and_idle(pd.DataFrame(intervals, columns=['start', 'end']))
    assert figures([(20, 30), (0, 10), (5, 12), (40, 41)]) == (41, 23, 18)
    assert figures([(3, 9), (4, 5)]) == (6, 6, 0)  # one inside another
    assert figures([]) == (0, 0, 0)


def event(name, cat, start, end, **args):
    """A complete event as kineto writes it: microseconds (here given in ms), ids in args."""
    return {'ph': 'X', 'cat': cat, 'name': name, 'ts': start * 1000.0, 'dur': (end - start) * 1e3,
            'args': {'External id' if key == 'external' else key: v for key, v in args.items()}}


# A window of 100-1000 ms, 2 steps: eager launches (runtime, driver), two CUDA-graph launches each
# replaying two activities of its correlation id, a kernel linked by its operator only, one to
# nothing, one launched after the window, a range mirrored on the GPU, a synchronization of 90 ms,
# an operator whose External id is the convolution's correlation id (another id space)
HOST = [event('aten::addmm', 'cpu_op', 50, 60, external=1),
        event('airbench: timed start', 'user_annotation', 100, 100, external=2),
        event('cudaLaunchKernel', 'cuda_runtime', 150, 151, correlation=1, external=4),
        event('triton_poi_fused_add_0', 'cpu_op', 159, 162, external=5),
        event('cuLaunchKernel', 'cuda_driver', 160, 161, correlation=2, external=5),
        event('cudaGraphLaunch', 'cuda_runtime', 170, 172, correlation=3, external=6),
        event('cudaGraphLaunch', 'cuda_runtime', 180, 182, correlation=8, external=7),
        event('aten::mm', 'cpu_op', 500, 510, external=10),
        event('cudaDeviceSynchronize', 'cuda_runtime', 900, 990, correlation=11),
        event('airbench: timed stop', 'user_annotation', 1000, 1000, external=12),
        event('cudaLaunchKernel', 'cuda_runtime', 2000, 2001, correlation=13)]
GPU = [event('sm90_xmma_fprop_implicit_gemm', 'kernel', 200, 300, correlation=1, external=4),
       event('triton_poi_fused_add_0', 'kernel', 310, 330, correlation=2, external=5),
       event('triton_red_fused_sum_1', 'kernel', 400, 450, correlation=3),
       event('Memset (Device)', 'gpu_memset', 460, 470, correlation=3),
       event('sm90_xmma_fprop_implicit_gemm', 'kernel', 465, 520, correlation=8),
       event('triton_red_fused_sum_1', 'kernel', 520, 530, correlation=8),
       event('nvjet_hsh_128x256', 'kernel', 600, 700, external=10),
       event('void unlinked_kernel', 'kernel', 800, 810, correlation=99),
       event('triton_poi_fused_mul_2', 'kernel', 2100, 2200, correlation=13),
       event('airbench: timed start', 'gpu_user_annotation', 120, 140, external=2)]


def frame_of(tmp_path, events):
    path = tmp_path / 'trace.json'
    path.write_text(json.dumps({'schemaVersion': 1, 'traceEvents': events}))
    return profile_run.trace_frame(path)


def report(summary):
    return profile_run.trace_report(dict(
        summary, script='synthetic', device='a GPU', torch='x', timed_seconds=0.9,
        graphs_traced_in_run=0, cpu_ms_per_step_inside={}, cpu_ms_per_run_inside={},
        flops=0.45e15, peak_tflops=1000))


def test_the_figures_of_a_synthetic_trace_with_cuda_graphs(tmp_path):
    """Every activity counts where the host launched it in the window, the graphs' by their
    launches' correlation ids; the union of overlapping activities counts once."""
    frame = frame_of(tmp_path, HOST + GPU)
    summary = profile_run.trace_summary(frame, steps=2)
    assert (summary['windows'], summary['gpu_activities'], summary['unlinked_gpu_activities']) \
        == (1, 7, 1)
    assert summary['kernel_ms_by_kind'] == {'matmul/conv': 255, 'triton fused': 80,
                                            'copy/memset': 10, 'other': 0}
    assert summary['calls_by_kind'] == {'matmul/conv': 3, 'triton fused': 3, 'copy/memset': 1,
                                        'other': 0}
    assert summary['gpu_figures_complete'] and summary['gpu_work_missing'] == []
    # busy: 200-300, 310-330, 400-450, 460-530 (a memset and a kernel overlapping), 600-700
    assert (summary['span_ms'], summary['busy_ms'], summary['idle_ms']) == (500, 340, 160)
    assert summary['kernel_launches_per_step'] == 1.0  # 2 in the window, one after it
    assert (summary['graph_launches_per_step'], summary['graph_kernels_per_step']) == (1, 2)
    assert (summary['synchronizations'], summary['waiting_ms'], summary['cpu_ms_per_step']) == \
        (1, 90, (900 - 90) / 2)
    lines = report(summary)
    assert lines[1] == ('GPU span 500.0 ms: busy 340.0 ms, idle between kernels 160.0 ms; 7 GPU '
                        'activities (1 in the trace not linked to a launch, left out)')
    assert '1.00 CUDA-graph launches replaying 2.0 kernels' in lines[3]
    assert lines[5] == ('FLOPs: 0.450 PFLOPs (tools/flops.py) in 0.900 s = 500 TFLOP/s, 50.0% of '
                        '1000 TFLOP/s')
    table = profile_run.kernel_table(frame)
    assert list(table.name[:2]) == ['sm90_xmma_fprop_implicit_gemm', 'nvjet_hsh_128x256']
    assert list(table.calls[:2]) == [2, 1] and table.calls.sum() == 7


GRAPHS_LOST = ('CUDA-graph launches in the timed windows have no kernel in the trace (the '
               'profiler did not record what they replayed)')


@pytest.mark.parametrize('kept, missing', [
    (GPU[:2] + GPU[6:], f'2 of 2 {GRAPHS_LOST}'), (GPU[:4] + GPU[6:], f'1 of 2 {GRAPHS_LOST}'),
    (GPU[:7] + [event('void unlinked', 'kernel', 480, 490, correlation=99)],
     '1 GPU activities inside the span are linked to no launch')])
def test_work_missing_from_the_trace_makes_the_figures_incomplete(tmp_path, kept, missing):
    """As where the profiler did not record what graphs replayed, or a kernel is linked to no
    launch: busy and idle time are not given, and the report says why."""
    summary = profile_run.trace_summary(frame_of(tmp_path, HOST + kept), steps=2)
    assert not summary['gpu_figures_complete'] and summary['gpu_work_missing'] == [missing]
    assert summary['span_ms'] is summary['busy_ms'] is summary['idle_ms'] is None
    assert summary['graph_launches_without_kernels'] == int(missing[0]) * ('graph' in missing)
    lines = report(summary)
    assert lines[1].startswith(f'GPU busy and idle time: incomplete, not printed: {missing}')
    assert lines[2].startswith('kernel time by kind (incomplete): ')


def test_trace_times_are_read_exactly_and_windows_must_pair(tmp_path):
    """Kineto writes microseconds since the epoch with 3 decimals: nanoseconds a float rounds."""
    (tmp_path / 'trace.json').write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1764288000123456.789, '
        '"dur": 0.003, "args": {"correlation": 5}}, {"ph": "X", "cat": "cpu_op", "name": "op", '
        '"ts": 1764288000123456.780, "dur": 1}]}')
    frame = profile_run.trace_frame(tmp_path / 'trace.json')
    assert list(frame.start) == [9, 0] and list(frame.end) == [12, 1000]
    assert list(frame.correlation) == [5, 0] and list(frame.external) == [0, 0]
    with pytest.raises(ValueError, match='no timed windows that pair up'):
        profile_run.trace_summary(frame_of(tmp_path, HOST[:-2] + GPU), steps=2)


def test_a_cpu_profile_of_airbench94(tmp_path):
    """Its three windows (the whitening, the epoch, TTA), the ranges timed, the files of --out."""
    summary = profile_run.main(['trace', 'airbench94', *TINY, '--train-images', '128',
                                '--test-images', '64', '--out', str(tmp_path)])
    assert (summary['steps'], summary['windows'], summary['gpu_activities']) == (4, 3, 0)
    assert summary['graphs_traced_in_run'] == 0 and summary['flops'] > 0
    assert list(summary['cpu_ms_per_run_inside']) == ['whitening', 'TTA']
    assert min(summary['cpu_ms_per_run_inside'].values()) > 0
    assert summary['cpu_ms_per_step_inside']['optimizer'] > 0
    assert json.loads((tmp_path / 'summary.json').read_text()) == summary
    assert 'airbench: TTA' in (tmp_path / 'ops.txt').read_text()
    assert (tmp_path / 'kernels.csv').read_text().startswith('name,kind,calls,ms')


@pytest.mark.parametrize('argv, message', [
    (['airbench94', '--chrome-trace'], '--chrome-trace writes OUT/trace.json'),
    (['airbench94', '--device', 'cpu', '--hyp', 'opt.no=1'], 'no hyperparameter opt.no'),
    (['airbench_nonexistent'], 'unknown script'),
    (['airbench94_hiverge'], 'sees no CUDA device; use --device cpu')])
def test_bad_input_is_refused_in_one_line(argv, message, capsys):
    if 'CUDA' in message and torch.cuda.is_available():
        pytest.skip('a GPU is present')
    with pytest.raises(SystemExit) as stopped:
        profile_run.main(['trace', *argv])
    error = stopped.value.code if isinstance(stopped.value.code, str) else \
        capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error


@pytest.mark.slow
def test_the_command_line_on_airbench94_hiverge(tmp_path):
    """DeviceClock's marks: the epoch's window and TTA's; the trace kept with --chrome-trace."""
    data = write_image_folder(str(tmp_path / 'data'))
    done = subprocess.run([sys.executable, f'{REPO}/tools/profile_run.py', 'trace',
                           'airbench94_hiverge', *TINY, '--data-dir', data, '--out',
                           str(tmp_path / 'out'), '--chrome-trace'], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert (summary['steps'], summary['windows']) == (12, 2)  # 384 images in batches of 32
    assert summary['graphs_traced_in_run'] == 0
    assert 'airbench: timed start' in (tmp_path / 'out' / 'trace.json').read_text()
    assert done.stdout.startswith('airbench94_hiverge on the CPU')
