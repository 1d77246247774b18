"""Profile one timed run of one of our scripts with torch.profiler: on CUDA, where its GPU time
goes, the kernels that CUDA graphs replay included.

SCRIPT (ours by name, or a path: studylib's load_script): its network built once, the tail's CUDA
warmup (warm_up(..., full=True): every graph compiled), then one train() without per-epoch
evaluation profiled, its timed windows (DeviceClock's marks, synchronized_time's pairs) marked.

The kernels a CUDA graph replays carry the CUPTI correlation id of their cudaGraphLaunch, no
operator's: torch.profiler's per-operator summaries and HolisticTraceAnalysis (its issue 290)
leave them out. Here the exported Chrome trace links each GPU activity to the runtime or driver
call of its correlation id (else its operator, by External id) and counts it where the host
launched it in a timed window. Printed: the GPU's span over the windows' activities, busy (their
union) and idle; where a CUDA-graph launch in the windows has no activity in the trace, or one
inside the span is linked to no launch, these would be wrong, and it says they are incomplete,
and why, instead (summary.json: gpu_figures_complete false, gpu_work_missing; span, busy, idle
null). Kernel time and calls by kind; per step the host's kernel and graph launches, what the
graphs replayed, its CPU time not waiting in synchronizations and inside torch's ranges
(key_averages; whitening and TTA per run); graphs dynamo traced in the run; the FLOP/s
(tools/flops.py's count of the run) as a fraction of the GPU's dense fp16 peak. --out DIR:
summary.json, kernels.csv (kind, calls, ms), ops.txt (key_averages' table), with --chrome-trace
trace.json. --device cpu: the same on a CPU, without kernels (a check of the tool). Data: random
images of CIFAR-10's shape (--train-images, --test-images), or --data-dir (the tail's loader).

Usage: python tools/profile_run.py trace SCRIPT [--data-dir DIR] [--out DIR] [--chrome-trace]
           [--epochs E] [--hyp KEY=VALUE ...] [--peak-tflops T] [--seed 0] [--device cpu]
e.g.   python tools/profile_run.py trace airbench94 --device cpu --epochs 1 --train-images 256 \\
           --test-images 64 --hyp opt.batch_size=32 \\
           --hyp "net.widths={'block1': 8, 'block2': 16, 'block3': 16}"   (docs/gpu.md)
"""
import argparse
import decimal
import functools
import itertools
import json
import os
import pathlib
import re
import sys
import tempfile
import types

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from studylib.device import compile_counts  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.hyp import config_hyp  # noqa: E402
from studylib.runs import random_split  # noqa: E402
from studylib.scripts import load_script  # noqa: E402

MARKS = ('airbench: timed start', 'airbench: timed stop')
LABELLED = {'init_whitening': 'whitening', 'infer': 'TTA'}  # the script's, run once per run
KERNEL_LAUNCHES = {'cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cuLaunchKernelEx'}
GRAPH_LAUNCHES = {'cudaGraphLaunch', 'cuGraphLaunch'}
SYNCHRONIZATIONS = {'cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventSynchronize'}
GPU_ACTIVITIES = {'kernel', 'gpu_memcpy', 'gpu_memset'}
LAUNCHING_CALLS = {'cuda_runtime', 'cuda_driver'}  # their GPU activities carry their correlation
OPERATORS = {'cpu_op', 'user_annotation'}  # their calls and GPU activities carry their External id
KINDS = ('matmul/conv', 'triton fused', 'copy/memset', 'other')
KIND_PATTERNS = [('copy/memset', '^mem(cpy|set)'), ('matmul/conv', '^triton_(tem_|mm|bmm|conv)'),
                 ('triton fused', '^triton_'),  # inductor's pointwise, reductions, persistent
                 ('matmul/conv', 'gemm|xmma|cutlass|fprop|dgrad|wgrad|conv|nvjet|cublas'),
                 ('copy/memset', 'copy|fillfunctor|memset')]  # the first that matches
# Ranges by the start of their names: torch's own, and those this tool adds (LABELLED)
RANGES = {'optimizer': ('Optimizer.step#', 'Optimizer.zero_grad#'),
          'compiled regions': ('Torch-Compiled Region',),
          'autograd backward': ('autograd::engine::evaluate_function: ',),
          **{kind: (f'airbench: {kind}',) for kind in LABELLED.values()}}
# Dense fp16 tensor-core peak, TFLOP/s, by a part of the device's name (the first that matches)
PEAK_TFLOPS = {'H100 PCIe': 756, 'H100 NVL': 835, 'H100': 989, 'H200': 989, 'A100': 312,
               'L40S': 362, 'L4': 121}


def kernel_kind(name, activity='kernel'):
    """'matmul/conv', 'triton fused', 'copy/memset' or 'other': by a GPU activity's kind, name."""
    if activity in ('gpu_memcpy', 'gpu_memset'):
        return 'copy/memset'
    return next((kind for kind, pattern in KIND_PATTERNS if re.search(pattern, name.lower())),
                'other')


def busy_and_idle(intervals):
    """(span, busy: the length of the union, idle: the rest) of a frame's start-end intervals:
    overlapping kernels (streams, a memset beside a kernel) count once."""
    if intervals.empty:
        return 0, 0, 0
    ordered = intervals.sort_values('start')
    reach = ordered.end.cummax().shift(fill_value=ordered.start.iloc[0])
    busy = int((ordered.end - ordered.start.clip(lower=reach)).clip(lower=0).sum())
    span = int(ordered.end.max() - ordered.start.iloc[0])
    return span, busy, span - busy


def trace_frame(path):
    """The complete events of a Chrome trace as torch.profiler exports it: name, activity (its
    category), start and end (exact nanoseconds from the trace's first event: kineto writes
    microseconds since the epoch, which a float would round), correlation (CUPTI's, shared by a
    runtime call and what it launched) and external (the operator's External id)."""
    with open(path) as f:
        events = pd.json_normalize(json.load(f, parse_float=decimal.Decimal)['traceEvents'])
    events = events[events.ph == 'X'].reindex(
        columns=['name', 'cat', 'ts', 'dur', 'args.correlation', 'args.External id'])
    start = events.ts.map(lambda ts: int(1000 * ts))
    end = start + events.dur.fillna(0).map(lambda dur: int(1000 * dur))
    return pd.DataFrame(dict(
        name=events.name, activity=events.cat.fillna('').str.lower(),
        start=start - start.min(), end=end - start.min(),
        correlation=events['args.correlation'].fillna(0).astype(int),
        external=events['args.External id'].fillna(0).astype(int))).reset_index(drop=True)


def timed_windows(frame):
    """The timed windows, [start, stop), from the markers this tool puts in the trace."""
    marks = frame[frame.name.isin(MARKS) & (frame.activity == 'user_annotation')]
    marks = marks.sort_values('start')
    if marks.empty or list(marks.name) != list(MARKS) * (len(marks) // 2):
        raise ValueError(f'the trace has no timed windows that pair up ({len(marks)} marks)')
    return pd.IntervalIndex.from_arrays(marks.start.values[::2], marks.start.values[1::2],
                                        closed='left')


def in_windows(times, windows):
    return pd.Series(windows.get_indexer(times) >= 0, index=times.index)


def launch_times(frame, gpu):
    """When the host launched each GPU activity: the runtime or driver call of its correlation
    id (for what a CUDA graph replays, the graph's launch), else its operator (External id); NaN
    where neither is in the trace."""
    calls = frame[frame.activity.isin(LAUNCHING_CALLS) & (frame.correlation > 0)]
    operators = frame[frame.activity.isin(OPERATORS) & (frame.external > 0)]
    by_operator = gpu.external.map(operators.groupby('external').start.min())
    return gpu.correlation.map(calls.groupby('correlation').start.min()).fillna(by_operator)


def missing_work(replayed, unlinked, gpu):
    """Why busy and idle time would be wrong, a clause each: graph launches whose activities the
    trace lacks, activities inside the span linked to no launch."""
    empty = int((replayed == 0).sum())
    inside = int(((unlinked.end > gpu.start.min()) & (unlinked.start < gpu.end.max())).sum())
    return [reason for count, reason in (
        (empty, f'{empty} of {len(replayed)} CUDA-graph launches in the timed windows have no '
                'kernel in the trace (the profiler did not record what they replayed)'),
        (inside, f'{inside} GPU activities inside the span are linked to no launch')) if count]


def gpu_work(frame, windows):
    """(the GPU activities launched in the windows, with kind and ms; those linked to none)."""
    gpu = frame[frame.activity.isin(GPU_ACTIVITIES)]
    gpu = gpu.assign(launched=launch_times(frame, gpu))
    linked = gpu[in_windows(gpu.launched, windows)]
    kinds = [kernel_kind(name, activity) for name, activity in zip(linked.name, linked.activity)]
    return linked.assign(kind=kinds, ms=(linked.end - linked.start) / 1e6), \
        gpu[gpu.launched.isna()]


def trace_summary(frame, steps):
    """The figures of a trace's timed windows: the GPU's, its CUDA graphs', the host's per step."""
    if steps <= 0:
        raise ValueError(f'no training step in the timed windows ({steps}): nothing to divide by')
    windows = timed_windows(frame)
    gpu, unlinked = gpu_work(frame, windows)
    host = frame[frame.activity.isin(LAUNCHING_CALLS) & in_windows(frame.start, windows)]
    graphs = host[host.name.isin(GRAPH_LAUNCHES)]
    replayed = graphs.correlation.map(gpu.correlation.value_counts()).fillna(0).astype(int)
    missing = missing_work(replayed, unlinked, gpu)
    span, busy, idle = (None if missing else ns / 1e6 for ns in busy_and_idle(gpu))
    by_kind = gpu.groupby('kind').ms.agg(['sum', 'size']).reindex(KINDS, fill_value=0)
    waits = host[host.name.isin(SYNCHRONIZATIONS)]
    waiting = busy_and_idle(waits)[1]
    return dict(steps=steps, windows=len(windows), gpu_activities=len(gpu),
                unlinked_gpu_activities=len(unlinked), gpu_figures_complete=not missing,
                gpu_work_missing=missing, span_ms=span, busy_ms=busy, idle_ms=idle,
                kernel_ms_by_kind=by_kind['sum'].astype(float).to_dict(),
                calls_by_kind=by_kind['size'].astype(int).to_dict(),
                kernel_launches_per_step=int(host.name.isin(KERNEL_LAUNCHES).sum()) / steps,
                graph_launches_per_step=len(graphs) / steps,
                graph_kernels_per_step=int(replayed.sum()) / steps,
                graph_launches_without_kernels=int((replayed == 0).sum()),
                synchronizations=len(waits), waiting_ms=waiting / 1e6,
                cpu_ms_per_step=(sum(windows.length) - waiting) / 1e6 / steps)


def kernel_table(frame):
    """Every kernel (copy, memset) of the windows: its kind, calls and milliseconds."""
    gpu = gpu_work(frame, timed_windows(frame))[0]
    table = gpu.groupby(['name', 'kind']).ms.agg(calls='size', ms='sum').reset_index()
    return table.sort_values('ms', ascending=False)


def range_times(averages, steps):
    """CPU ms inside each kind of range (RANGES), by torch.profiler's key_averages: per step, and
    per run for those the run enters once."""
    totals = {kind: sum(e.cpu_time_total for e in averages if e.key.startswith(starts)) / 1e3
              for kind, starts in RANGES.items()}
    once = set(LABELLED.values())
    return dict(cpu_ms_per_step_inside={k: ms / steps for k, ms in totals.items() if k not in once},
                cpu_ms_per_run_inside={k: ms for k, ms in totals.items() if k in once})


def marked(function):
    """function, each call followed by a marker: a window's start, then its stop, in turn."""
    calls = itertools.count()

    @functools.wraps(function)
    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        with record_function(MARKS[next(calls) % 2]):
            return result
    return call


def instrument(script):
    """Mark the script's timed windows and label its whitening and TTA (a module of its own:
    load_script makes a new one each call, nothing to undo)."""
    if hasattr(script, 'DeviceClock'):
        script.DeviceClock.mark = marked(script.DeviceClock.mark)
    else:
        script.synchronized_time = marked(script.synchronized_time)
    for name, kind in LABELLED.items():
        setattr(script, name, record_function(f'airbench: {kind}')(getattr(script, name)))


def run_data(script, options, device):
    """The run's data on the device: --data-dir's, else random images of CIFAR-10's shape."""
    if options.data_dir:
        data = script.load_dataset(options.data_dir, download=False)
    else:
        torch.manual_seed(options.seed)
        data = dict(train=random_split(options.train_images, 10, 'cpu'),
                    test=random_split(options.test_images, 10, 'cpu'), classes=list(range(10)),
                    mean=script.CIFAR10_MEAN, std=script.CIFAR10_STD)
    return {**data, **{split: {key: value.to(device) for key, value in data[split].items()}
                       for split in ('train', 'test')}}


def profiled_run(script, hyp, data, device, seed):
    """Warm up as main() does on CUDA, then profile one train(): (its result, the profile, the
    graphs dynamo traced during it)."""
    precision = script.precision_for(device)
    net = script.build_net(hyp['net'], len(data['classes']), device, precision)
    torch.backends.cudnn.benchmark = True
    script.warm_up(script.train, data, hyp, device, precision, seed, net, full=True)
    instrument(script)
    traced = compile_counts()[0]
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == 'cuda')
    with profile(activities=activities) as prof:
        result = script.train(data, hyp, device, precision, seed, net, epoch_eval=False)
    return result, prof, compile_counts()[0] - traced


def peak_tflops(device_name):
    """The dense fp16 tensor peak of a GPU of this name (TFLOP/s), or None where unknown."""
    return next((peak for part, peak in PEAK_TFLOPS.items() if part in device_name), None)


def trace_report(s):
    """The summary's figures as lines of text."""
    def listed(figures, digits):
        return ', '.join(f'{kind} {ms:.{digits}f}' for kind, ms in figures.items())
    found = (f'{s["gpu_activities"]} GPU activities ({s["unlinked_gpu_activities"]} in the trace '
             'not linked to a launch, left out)')
    tflops = s['flops'] / s['timed_seconds'] / 1e12
    return [
        f'{s["script"]} on {s["device"]}, torch {s["torch"]}: one timed run, {s["steps"]} steps, '
        f'{s["windows"]} timed windows, {s["timed_seconds"]:.3f} s timed (its own timer), '
        f'{s["graphs_traced_in_run"]} graphs traced by dynamo in it',
        f'GPU span {s["span_ms"]:.1f} ms: busy {s["busy_ms"]:.1f} ms, idle between kernels '
        f'{s["idle_ms"]:.1f} ms; {found}' if s['gpu_figures_complete'] else
        f'GPU busy and idle time: incomplete, not printed: {"; ".join(s["gpu_work_missing"])}; '
        f'{found}',
        'kernel time by kind' + ('' if s['gpu_figures_complete'] else ' (incomplete)') + ': '
        + ', '.join(f'{kind} {ms:.1f} ms in {s["calls_by_kind"][kind]} calls'
                    for kind, ms in s['kernel_ms_by_kind'].items()),
        f'per step: {s["kernel_launches_per_step"]:.1f} kernel launches, '
        f'{s["graph_launches_per_step"]:.2f} CUDA-graph launches replaying '
        f'{s["graph_kernels_per_step"]:.1f} kernels, copies and memsets, '
        f'{s["cpu_ms_per_step"]:.3f} ms of CPU ({s["synchronizations"]} synchronizations '
        f'waited {s["waiting_ms"]:.1f} ms in all)',
        f'CPU ms inside ranges, per step: {listed(s["cpu_ms_per_step_inside"], 3)}; per run: '
        f'{listed(s["cpu_ms_per_run_inside"], 1)}',
        f'FLOPs: {s["flops"] / 1e15:.3f} PFLOPs (tools/flops.py) in {s["timed_seconds"]:.3f} s = '
        f'{tflops:.0f} TFLOP/s, ' + (f'{100 * tflops / s["peak_tflops"]:.1f}% of '
                                    f'{s["peak_tflops"]} TFLOP/s' if s['peak_tflops'] else
                                    'no peak known (--peak-tflops)')]


def write_outputs(out, summary, frame, prof):
    os.makedirs(out, exist_ok=True)
    pathlib.Path(out, 'summary.json').write_text(json.dumps(summary, indent=2))
    kernel_table(frame).to_csv(os.path.join(out, 'kernels.csv'), index=False)
    sort = 'self_device_time_total' if summary['device'] != 'the CPU' else 'self_cpu_time_total'
    pathlib.Path(out, 'ops.txt').write_text(prof.key_averages().table(
        sort_by=sort, row_limit=60, max_name_column_width=80))


def prepared(options):
    """(the script, the run's hyp, its data on the device, the device), or a one-line error."""
    try:
        script = load_script(options.script)
        device = script.resolve_device(options.device)
        flags = types.SimpleNamespace(dataset='cifar10', epochs=options.epochs, hyp=options.hyp)
        hyp = config_hyp(script.hyp, script.HYP_CHOICES, script.HYP_RANGES, flags)
        return script, hyp, run_data(script, options, device), device
    except (StudyError, ValueError, OSError) as error:
        sys.exit(f'error: {error}')


def exported_frame(prof, options):
    """The profile read back from its Chrome trace, kept in OUT with --chrome-trace."""
    with tempfile.TemporaryDirectory(prefix='profile_run-') as scratch:
        folder = options.out if options.chrome_trace else scratch
        os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(folder, 'trace.json'))
        return trace_frame(os.path.join(folder, 'trace.json'))


def run_figures(script, hyp, data, device, options):
    """What the run was, on what, and its FLOPs (tools/flops.py's count of the run as made)."""
    import flops  # tools/flops.py, beside this file
    script.hyp = hyp
    counted = flops.run_flops(script, len(data['train']['labels']), len(data['test']['labels']),
                              len(data['classes']))
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU'
    return dict(script=options.script, device=name, torch=torch.__version__,
                flops=counted['exact'], peak_tflops=options.peak_tflops or peak_tflops(name))


def trace_command(options):
    script, hyp, data, device = prepared(options)
    result, prof, traced = profiled_run(script, hyp, data, device, options.seed)
    frame = exported_frame(prof, options)
    summary = dict(trace_summary(frame, result['steps']),
                   **range_times(prof.key_averages(), result['steps']),
                   timed_seconds=result['total_time_seconds'], graphs_traced_in_run=traced,
                   **run_figures(script, hyp, data, device, options))
    print('\n'.join(trace_report(summary)))
    if options.out:
        write_outputs(options.out, summary, frame, prof)
    return summary


def parse_args(argv):
    parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
    add = parser.add_argument
    add('command', choices=['trace'], help='trace one timed run')
    add('script', help='one of ours by name, or a path')
    add('--device', default='cuda', help='cuda (default), or cpu to check the tool')
    add('--data-dir', help='an image folder or CIFAR-10 (default: random images)')
    add('--train-images', type=int, default=50000, help='random training images')
    add('--test-images', type=int, default=10000, help='random test images')
    add('--epochs', type=float, help="hyp's opt.train_epochs")
    add('--hyp', action='append', default=[], metavar='KEY=VALUE', help='a hyp entry, as study.py')
    add('--peak-tflops', type=float, help="the GPU's dense fp16 peak (default: by its name)")
    add('--seed', type=int, default=0, help="the run's seed and the random images' (default 0)")
    add('--out', help='a directory for summary.json, kernels.csv and ops.txt')
    add('--chrome-trace', action='store_true', help='also write OUT/trace.json')
    options = parser.parse_args(argv)
    if options.chrome_trace and not options.out:
        parser.error('--chrome-trace writes OUT/trace.json: give --out OUT')
    return options


def main(argv=None):
    return trace_command(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == '__main__':
    main()
