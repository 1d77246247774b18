"""Profile one timed run of a script, ours or a published one, after its warmup: on CUDA a trace of
where the run's time goes, on a CPU a count of what its host dispatches per training step.

SCRIPT is one of ours by name (airbench94_hiverge) or a published script's path (tools/reference.py
says where to get them), run as published but for its number of runs (one, after its own warmup).
Ours: the network built once, main()'s warmup on CUDA (warm_up(..., full=True)), then one train()
without per-epoch evaluation is profiled. A published script: its main block, whose one timed
main() call is profiled. Only the script's timed windows count (ours: its synchronized_time pairs;
a published script: its CUDA events' record pairs); steps are ours' train() result, a published
script's batches its loader yields in them.

trace (CUDA): torch.profiler, CPU and CUDA activities, read back from the Chrome trace it exports
(there every torch names each event's category; not every torch does on its events in Python). A
GPU activity counts when the host launched it in the windows: by the runtime or driver call whose
CUPTI correlation id it carries (the kernels a CUDA graph replays carry their cudaGraphLaunch's),
else by its CPU operator's External id. Printed: kernel time and calls by kind (convolutions and
matrix products, Triton-fused elementwise and reductions, copies and memsets, other: by kernel
name), the GPU's busy time (the union of the windows' GPU activities) and idle time between them
over their span; but where a CUDA-graph launch in the windows has no kernel in the trace (the
profiler did not record what it replayed) or a GPU activity inside the span is linked to no
launch, these would be wrong, and it prints that they are incomplete, and why, instead
(summary.json: gpu_figures_complete false, gpu_work_missing, span, busy and idle null). Per step:
kernel launches (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel) and CUDA-graph launches
from the host, the kernels, copies and memsets the graphs replayed, the host's CPU time (not
waiting in synchronizations) and inside each kind of range (optimizer, loss, loader, compiled
regions, ...); and the FLOP/s achieved (tools/flops.py's count of the run, where it counts the
script, over the timed seconds) as a fraction of the GPU's dense fp16 tensor peak (PEAK_TFLOPS,
or --peak-tflops). --out DIR: kernels.csv (every kernel: kind, calls, milliseconds),
summary.json, and with --chrome-trace the trace. --device cpu runs the same on a CPU, without
kernels: a check of the tool. HolisticTraceAnalysis (holistictraceanalysis 0.5.0) is not used,
after reading it and running it on the tests' synthetic trace: its idle time spans every GPU
event of the trace (or of its ProfilerStep iterations), not the windows' work (there 2000 ms,
1550 idle, against the windows' 500 and 160); with the graphs' kernels missing it gave 1670 ms
idle and no sign of it; its kernel types are computation, communication and memory, not these
kinds; it rounds nanoseconds to microseconds.

count (CPU): per training step, counted as the script runs on CUDA: operators dispatched eagerly
(top-level ATen operators outside compiled graphs that do work, each at least one kernel launch
on CUDA; views, allocations and scalar reads not counted), by where they come from (optimizer,
loss, loader, other; whitening and TTA per run), calls of compiled graphs (forward, backward or
inference: on CUDA each a CUDA-graph replay or a few fused kernels), graphs compiled and
recompiles (dynamo's: a frame compiled again after a guard failed), host synchronizations inside
the timed windows (_local_scalar_dense as .item() reads, nonzero as boolean-mask indexing does,
masked_select, equal) and the timed windows (each ends with a synchronization on CUDA). As on
CUDA: torch.compile keeps dynamo and AOTAutograd, as inductor traces, and runs the graphs' ATen
operators (aot_eager's); ours' compiles(device) is True and they run in the CUDA recipe (fp16
weights, BatchNorm in fp32 but in airbench94_hiverge); SGD is fused where the script asks for fused on CUDA (ours pass
fused=device.type == 'cuda'), else foreach (CUDA's default); a published script runs through
tools/reference.py's redirection of CUDA to the CPU, but with its fp16 and torch.compile kept.
Small and quick: random uint8 images, batches of --batch-size (8) instead of the script's and
block widths --widths (2,8,8: 64/256/256 over 32, the same number of distinct filter shapes), as
many training images as give the script's steps per epoch (50,000 // its batch size), its whole
schedule (or --epochs) and 10,000 test images; the counts do not depend on batch size or widths
(docs/cpu.md). Each script is counted in a process of its own.

Usage: python tools/profile_run.py trace SCRIPT [--data-dir DIR] [--out DIR] [--chrome-trace]
                                             [--peak-tflops T] [--seed 0] [--device cpu]
       python tools/profile_run.py count SCRIPT [SCRIPT ...] [--batch-size 8] [--widths 2,8,8]
                                             [--as-published] [--epochs E] [--out DIR]
e.g.   python tools/profile_run.py count airbench94_hiverge REF/hiverge_cifar10_speedrun.py
(docs/gpu.md, "Profiling one run"; docs/cpu.md, "What the host dispatches per step").
"""
import argparse
import bisect
import collections
import contextlib
import decimal
import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import types

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import reference  # noqa: E402  (tools/reference.py)

LABEL = 'airbench: '  # the prefix of the ranges this tool adds to a trace
MARK_START, MARK_STOP, GRAPH_RANGE = LABEL + 'timed start', LABEL + 'timed stop', LABEL + 'graph'
STEP_SOURCES = ('optimizer', 'loss', 'loader', 'other')  # every step's; whitening, TTA: per run
RUN_SOURCES = ('whitening', 'evaluation')
# Functions and methods labelled with where their operators come from, where a script has them
LABELLED_FUNCTIONS = {'init_whitening': 'whitening', 'init_whitening_conv': 'whitening',
                      'infer': 'evaluation', 'evaluate': 'evaluation'}
LABELLED_METHODS = {('CifarNet', 'init_whiten'): 'whitening',
                    ('LookaheadState', 'update'): 'optimizer'}
OPTIMIZER_RANGES = ('Optimizer.step#', 'Optimizer.zero_grad#')  # torch.optim's own
BACKWARD_RANGE = 'autograd::engine::evaluate_function: '
COMPILING_RANGES = ('dynamo',)  # dynamo compiling a frame (not running one): 'dynamo', ...
HOST_SYNCS = {'aten::_local_scalar_dense', 'aten::nonzero', 'aten::masked_select', 'aten::equal'}
# No work on the device although their schemas write: allocations, and in-place views and metadata
NO_DEVICE_WORK = {'empty', 'empty_strided', 'empty_like', 'new_empty', 'new_empty_strided', 'set_',
                  'resize_', 'resize_as_', 'detach_', 'as_strided_', 't_', 'transpose_',
                  'squeeze_', 'unsqueeze_', 'swapdims_', 'record_stream', '_unsafe_view'}
KERNEL_LAUNCHES = {'cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cuLaunchKernelEx'}
GRAPH_LAUNCHES = {'cudaGraphLaunch', 'cuGraphLaunch'}
SYNCHRONIZATIONS = {'cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventSynchronize'}
GPU_ACTIVITIES = {'kernel', 'gpu_memcpy', 'gpu_memset'}
# Dense fp16 tensor-core peak, TFLOP/s, by a part of the device's name (the first that matches)
PEAK_TFLOPS = {'H100 PCIe': 756, 'H100 NVL': 835, 'H100': 989, 'H200': 989, 'A100': 312,
               'L40S': 362, 'L4': 121}
CIFAR_TRAIN, CIFAR_TEST = 50000, 10000
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
RESULT_PREFIX = 'profile_run result: '


# ------------------------------------ Arithmetic on kernels ------------------------------------
def kernel_kind(name, activity='kernel'):
    """'matmul/conv', 'triton fused', 'copy/memset' or 'other', from a GPU activity's kind and a
    kernel's name."""
    lowered = name.lower()
    if activity in ('gpu_memcpy', 'gpu_memset') or lowered.startswith(('memcpy', 'memset')):
        return 'copy/memset'
    if lowered.startswith(('triton_tem_', 'triton_mm', 'triton_bmm', 'triton_conv')):
        return 'matmul/conv'
    if lowered.startswith('triton_'):
        return 'triton fused'
    if any(part in lowered for part in ('gemm', 'xmma', 'cutlass', 'fprop', 'dgrad', 'wgrad',
                                        'conv', 'nvjet', 'cublas')):
        return 'matmul/conv'
    if any(part in lowered for part in ('copy', 'fillfunctor', 'memset')):
        return 'copy/memset'
    return 'other'


def union_length(intervals):
    """The length of the union of (start, end) intervals."""
    total, reach = 0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def busy_and_idle(intervals):
    """(span from the first start to the last end, busy: the union's length, idle: the rest)."""
    if not intervals:
        return 0, 0, 0
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    busy = union_length(intervals)
    return span, busy, span - busy


def per_step(total, steps):
    if steps <= 0:
        raise ValueError(f'no training step in the timed windows ({steps}): nothing to divide by')
    return total / steps


def peak_tflops(device_name, override=None):
    """The dense fp16 tensor peak of a GPU of this name (TFLOP/s), or None where unknown."""
    if override is not None:
        return override
    return next((peak for part, peak in PEAK_TFLOPS.items() if part in device_name), None)


def flop_fraction(flops, seconds, peak):
    """(achieved TFLOP/s, the fraction of the peak it is)."""
    achieved = flops / seconds / 1e12
    return achieved, achieved / peak


def timed_windows(markers):
    """[(start, stop)] from the times of the start and stop markers, [(time, is_start)], in order;
    raises where they do not alternate start, stop, start, ..."""
    ordered = sorted(markers)
    if [is_start for _, is_start in ordered] != [True, False] * (len(ordered) // 2) or \
            len(ordered) % 2:
        raise ValueError('the timed windows do not pair up (a start without its stop?)')
    return [(ordered[i][0], ordered[i + 1][0]) for i in range(0, len(ordered), 2)]


def in_windows(moment, windows):
    """Whether a moment lies within one of the (sorted, disjoint) windows."""
    i = bisect.bisect_right([start for start, _ in windows], moment) - 1
    return i >= 0 and moment < windows[i][1]


def within(times, windows):
    """A boolean Series: which of the times (a Series; NaN: never) lie within the windows."""
    return times.map(lambda t: not math.isnan(t) and in_windows(t, windows)).astype(bool)


# ------------------------------- Instrumenting a script's run --------------------------------
def marker(name):
    with record_function(name):
        pass


class Recorder:
    """The run's timed windows (toggled at each read of its clock), the training batches yielded
    in them, and every graph torch.compile compiles (where the counting backend is in use)."""

    def __init__(self):
        self.timed = self.measuring = False
        self.batches, self.graphs = 0, []

    def toggle(self):
        self.timed = not self.timed
        marker(MARK_START if self.timed else MARK_STOP)

    def clock(self):
        """A stand-in for a script's time module: perf_counter() opens and closes the windows."""
        def perf_counter():
            self.toggle()
            return time.perf_counter()
        return types.SimpleNamespace(perf_counter=perf_counter)

    def batch(self):
        self.batches += self.measuring and self.timed

    def backend(self, graph_module, example_inputs):
        """The counting backend: records the graph (its compile id: a frame compiled again is a
        recompile), then AOTAutograd as inductor traces, running each graph's ATen operators."""
        from torch._dynamo.backends.common import aot_autograd
        compile_id = torch._guards.CompileContext.current_compile_id()
        self.graphs.append(dict(compile_id=str(compile_id), measured=self.measuring,
                                recompile=getattr(compile_id, 'frame_compile_id', 0) > 0))
        return aot_autograd(fw_compiler=marked_graph, keep_inference_input_mutations=True)(
            graph_module, example_inputs)

    def compile(self, model=None, *, mode=None, options=None, backend=None, **kwargs):
        """torch.compile's stand-in with the counting backend (mode and options are inductor's)."""
        if model is None:
            return lambda function: self.compile(function, **kwargs)
        return ORIGINAL['compile'](model, backend=self.backend, **kwargs)


def marked_graph(graph_module, example_inputs):
    """A compiled graph that runs its operators inside a GRAPH_RANGE: one call, one range."""
    from functorch.compile import make_boxed_func
    forward = graph_module.forward

    def run(*args):
        with record_function(GRAPH_RANGE):
            return forward(*args)
    return make_boxed_func(run)


ORIGINAL = {'compile': torch.compile, 'cross_entropy': F.cross_entropy,
            'scheduler_step': torch.optim.lr_scheduler.LRScheduler.step,
            'module_half': nn.Module.half, 'tensor_half': torch.Tensor.half,
            'module_compile': nn.Module.compile}


def labelled(function, source):
    """function, its operators inside a range naming their source (not while dynamo traces it)."""
    @functools.wraps(function)
    def in_range(*args, **kwargs):
        if torch.compiler.is_compiling():
            return function(*args, **kwargs)
        with record_function(LABEL + source):
            return function(*args, **kwargs)
    return in_range


def labelled_iteration(iterate, recorder):
    """A loader's __iter__ whose every step (the epoch's augmentation, then a batch) runs inside a
    'loader' range, counting the batches."""
    @functools.wraps(iterate)
    def __iter__(self):
        batches = iterate(self)
        while True:
            with record_function(LABEL + 'loader'):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
            recorder.batch()
            yield batch
    return __iter__


class SgdAsOnCuda(torch.optim.SGD):
    """SGD as the scripts run it on CUDA: fused where they ask for fused there (ours pass
    fused=device.type == 'cuda'), else foreach, CUDA's default for CUDA tensors."""

    def __init__(self, params, *args, foreach=None, fused=None, **kwargs):
        if fused is not None:
            fused, foreach = True, None
        elif foreach is None:
            foreach = True
        super().__init__(params, *args, foreach=foreach, fused=fused, **kwargs)


def set_attribute(stack, owner, name, value):
    """owner.name = value (a dict's item for a dict), put back when the stack closes."""
    if isinstance(owner, dict):
        stack.callback(owner.__setitem__, name, owner[name])
        owner[name] = value
    else:
        stack.callback(setattr, owner, name, getattr(owner, name))
        setattr(owner, name, value)


def label_script(stack, namespace, recorder):
    """Label the script's whitening, evaluation, Lookahead and loader (namespace: its globals)."""
    for name, source in LABELLED_FUNCTIONS.items():
        if callable(namespace.get(name)):
            set_attribute(stack, namespace, name, labelled(namespace[name], source))
    for (class_name, method), source in LABELLED_METHODS.items():
        owner = namespace.get(class_name)
        if isinstance(owner, type) and method in vars(owner):
            set_attribute(stack, owner, method, labelled(vars(owner)[method], source))
    loader = namespace.get('CifarLoader')
    if isinstance(loader, type):
        set_attribute(stack, loader, '__iter__', labelled_iteration(loader.__iter__, recorder))


def label_torch(stack):
    """Label the loss and learning-rate schedulers wherever they are called."""
    set_attribute(stack, F, 'cross_entropy', labelled(ORIGINAL['cross_entropy'], 'loss'))
    set_attribute(stack, torch.optim.lr_scheduler.LRScheduler, 'step',
                  labelled(ORIGINAL['scheduler_step'], 'optimizer'))


@contextlib.contextmanager
def as_on_cuda(recorder):
    """torch.compile with the counting backend, SGD as on CUDA (the count's stand-ins)."""
    with contextlib.ExitStack() as stack:
        set_attribute(stack, torch, 'compile', recorder.compile)
        set_attribute(stack, torch.optim, 'SGD', SgdAsOnCuda)
        yield


# -------------------------------------- Counting operators --------------------------------------
@functools.lru_cache(maxsize=None)
def launches_no_kernel(name):
    """Whether an ATen operator (by its profiler name) does no work of its own on the device, in
    every overload: it writes no argument, and returns views of its inputs or no tensor (a value
    for the host); or it is an allocation or an in-place view (NO_DEVICE_WORK)."""
    op = name.partition('::')[2]
    packet = getattr(torch.ops.aten, op, None)
    if op in NO_DEVICE_WORK or packet is None:
        return op in NO_DEVICE_WORK
    schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]

    def no_work(schema):
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        tensors = [r for r in schema.returns if 'Tensor' in str(r.type)]
        return not writes and all(r.alias_info is not None for r in tensors)
    return bool(schemas) and all(no_work(schema) for schema in schemas)


def does_work(event):
    """Whether an ATen operator's event, with the operators it called, does work on the device."""
    children = [child for child in event.cpu_children if child.name.startswith('aten::')]
    return not launches_no_kernel(event.name) or any(does_work(child) for child in children)


Context = collections.namedtuple('Context', 'source in_graph compiling in_aten in_sync',
                                 defaults=(None, False, False, False, False))


def entered(event, context, forward_sources):
    """The context of an event's own operators and of those it calls."""
    name = event.name
    if name.startswith(LABEL) and name[len(LABEL):] in STEP_SOURCES + RUN_SOURCES:
        context = context._replace(source=name[len(LABEL):])
    elif name.startswith(OPTIMIZER_RANGES):
        context = context._replace(source='optimizer')
    elif name.startswith(BACKWARD_RANGE):  # a backward node: the source of its forward operator
        context = context._replace(source=forward_sources.get(event.sequence_nr, context.source))
    return context._replace(in_graph=context.in_graph or name == GRAPH_RANGE,
                            compiling=context.compiling or name.startswith(COMPILING_RANGES))


def tally_event(event, context, timed, tally):
    """Count the event where it is a graph call, an eager operator or a host synchronization."""
    source = context.source or 'other'
    if context.compiling:
        return
    if event.name == GRAPH_RANGE:
        tally['graph_calls'][source, timed] += 1
    if not event.name.startswith('aten::'):
        return
    if not (context.in_aten or context.in_graph) and does_work(event):
        tally['eager_ops'][source, timed] += 1
    if event.name in HOST_SYNCS and not context.in_sync:
        tally['host_syncs'][event.name, source, timed] += 1


def count_events(events):
    """From a CPU profile's events: Counters of eager operators and graph calls by (source, timed),
    of host synchronizations by (operator, source, timed), and the number of timed windows."""
    markers = [(e.time_range.start, e.name == MARK_START) for e in events
               if e.name in (MARK_START, MARK_STOP)]
    windows = timed_windows(markers)
    tally = {kind: collections.Counter() for kind in ('eager_ops', 'graph_calls', 'host_syncs')}
    forward_sources = {}
    pending = [(event, Context()) for event in sorted(
        (e for e in events if e.cpu_parent is None), key=lambda e: e.time_range.start,
        reverse=True)]
    while pending:
        event, context = pending.pop()
        context = entered(event, context, forward_sources)
        tally_event(event, context, in_windows(event.time_range.start, windows), tally)
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD_RANGE):
            # the last event that shows a sequence number is the one whose node takes it
            forward_sources[event.sequence_nr] = context.source or 'other'
        inner = context._replace(in_aten=context.in_aten or event.name.startswith('aten::'),
                                 in_sync=context.in_sync or event.name in HOST_SYNCS)
        pending += [(child, inner) for child in sorted(
            event.cpu_children, key=lambda e: e.time_range.start, reverse=True)]
    return dict(tally, windows=len(windows))


def count_summary(name, tally, steps, recorder):
    """The figures of one script's count: per step, per run and over the timed windows."""
    def timed(kind, sources):
        return sum(tally[kind][source, True] for source in sources)

    def syncs(key, in_window):  # by operator (key 0) or by source (1)
        found = collections.Counter()
        for (op, source, t), n in tally['host_syncs'].items():
            found[(op, source)[key]] += n * (t == in_window)
        return {k: n for k, n in found.items() if n}
    graphs = recorder.graphs
    return dict(
        script=name, steps=steps, batches_timed=recorder.batches,
        eager_ops_per_step=per_step(timed('eager_ops', STEP_SOURCES), steps),
        graph_calls_per_step=per_step(timed('graph_calls', STEP_SOURCES), steps),
        eager_ops_per_step_by_source={s: per_step(timed('eager_ops', [s]), steps)
                                      for s in STEP_SOURCES},
        eager_ops_per_run={s: timed('eager_ops', [s]) for s in RUN_SOURCES},
        graph_calls_per_run={s: timed('graph_calls', [s]) for s in RUN_SOURCES},
        host_syncs_timed=sum(syncs(0, True).values()), host_syncs_timed_by_source=syncs(1, True),
        host_syncs_timed_by_operator=syncs(0, True),
        host_syncs_untimed=sum(syncs(0, False).values()),
        timing_windows=tally['windows'], graphs_compiled=len(graphs),
        graphs_compiled_in_run=sum(g['measured'] for g in graphs),
        recompiles=len({g['compile_id'] for g in graphs if g['recompile']}))


def profiled(recorder, call, activities):
    """call() under torch.profiler, as the measured run: (its result, the profile)."""
    recorder.measuring = True
    try:
        with profile(activities=activities) as prof:
            result = call()
    finally:
        recorder.measuring = False
    return result, prof


# ------------------------------------ Analysing a CUDA trace ------------------------------------
HOST_ACTIVITIES = {'cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver', 'python_function'}
LAUNCHING_CALLS = {'cuda_runtime', 'cuda_driver'}  # their GPU activities carry their correlation
OPERATORS = {'cpu_op', 'user_annotation'}  # their calls and GPU activities carry their External id


def trace_frame(path):
    """Every complete event ('ph': 'X') of a Chrome trace as torch.profiler exports it, one row
    each: name, activity (its category: cpu_op, cuda_runtime, kernel, ...), start and end (ns,
    exact: read as decimals), correlation (CUPTI's id of a runtime or driver call, which the GPU
    activities it launched carry: a graph launch's, every kernel the graph replays) and external
    (the External id of the CPU operator, which its calls and GPU activities carry)."""
    with open(path) as f:
        events = json.load(f, parse_float=decimal.Decimal)['traceEvents']

    def row(event):
        args = event.get('args', {})
        start = 1000 * decimal.Decimal(event['ts'])
        end = start + 1000 * decimal.Decimal(event.get('dur', 0))
        return dict(name=event['name'], activity=event.get('cat', '').lower(), start=int(start),
                    end=int(end), correlation=int(args.get('correlation', 0)),
                    external=int(args.get('External id', 0)))
    return pd.DataFrame([row(e) for e in events if e.get('ph') == 'X'],
                        columns=['name', 'activity', 'start', 'end', 'correlation', 'external'])


def frame_windows(frame):
    markers = frame[frame.name.isin([MARK_START, MARK_STOP]) & frame.activity.isin(OPERATORS)]
    return timed_windows(list(zip(markers.start, markers.name == MARK_START)))


def launch_times(frame, gpu):
    """For each GPU activity, when the host launched it: the start of the runtime or driver call
    of its correlation id (for a kernel a graph replays, the graph's launch), else of the CPU
    operator of its External id; NaN where neither is in the trace."""
    calls = frame[frame.activity.isin(LAUNCHING_CALLS) & (frame.correlation > 0)]
    operators = frame[frame.activity.isin(OPERATORS) & (frame.external > 0)]
    by_call = calls.groupby('correlation').start.min()
    by_operator = operators.groupby('external').start.min()
    return gpu.correlation.map(by_call).fillna(gpu.external.map(by_operator))


def gpu_work_in_windows(frame, windows):
    """The GPU's kernels, copies and memsets launched inside the windows, with their kind; and
    every GPU activity linked to no launch (left out: where it belongs is unknown)."""
    gpu = frame[frame.activity.isin(GPU_ACTIVITIES)].copy()
    gpu['launched'] = launch_times(frame, gpu)
    unlinked = gpu[gpu.launched.isna()]
    gpu = gpu[within(gpu.launched, windows)]
    gpu['kind'] = [kernel_kind(n, a) for n, a in zip(gpu.name, gpu.activity)]
    gpu['ms'] = (gpu.end - gpu.start) / 1e6
    return gpu, unlinked


def host_ranges(frame, windows):
    """The host's rows inside the windows, with the kind of range each is (or None)."""
    host = frame.activity.isin(HOST_ACTIVITIES)
    cpu = frame[host & within(frame.start.astype(float), windows)].copy()

    def kind(name):
        if name.startswith(LABEL) and name[len(LABEL):] in STEP_SOURCES + RUN_SOURCES:
            return name[len(LABEL):]
        if name.startswith(OPTIMIZER_RANGES):
            return 'optimizer'
        if name.startswith('Torch-Compiled Region'):
            return 'compiled regions'
        return 'autograd backward' if name.startswith(BACKWARD_RANGE) else None
    cpu['range'] = cpu.name.map(kind)
    return cpu


def graph_replays(cpu, gpu):
    """For each CUDA-graph launch in the windows (cpu: the host's rows there), how many GPU
    activities of its correlation id the trace holds: the kernels, copies, memsets it replayed."""
    launches = cpu[cpu.name.isin(GRAPH_LAUNCHES)]
    replayed = gpu[gpu.correlation > 0].correlation.value_counts()
    return launches.correlation.map(replayed).fillna(0).astype(int)


def missing_work(replays, unlinked, gpu):
    """Why the GPU's figures would leave work out, a clause each (none where nothing is missing):
    graph launches whose kernels the trace lacks, GPU activities inside the span linked to none."""
    empty = int((replays == 0).sum())
    inside = (unlinked.end > gpu.start.min()) & (unlinked.start < gpu.end.max())
    reasons = []
    if empty:
        reasons.append(f'{empty} of {len(replays)} CUDA-graph launches in the timed windows have '
                       'no kernel in the trace (the profiler did not record what they replayed)')
    if inside.any():
        reasons.append(f'{int(inside.sum())} GPU activities inside the span are linked to no '
                       'launch')
    return reasons


KINDS = ('matmul/conv', 'triton fused', 'copy/memset', 'other')


def gpu_figures(gpu, missing):
    """The GPU's time over the windows' work: milliseconds and calls by kind (what was found),
    span, busy and idle; these three None where work is missing (missing: why), as they would
    be wrong, not merely smaller."""
    span, busy, idle = busy_and_idle(list(zip(gpu.start, gpu.end)))
    by_kind = gpu.groupby('kind').ms.agg(['sum', 'size'])
    complete = not missing
    return dict(gpu_activities=len(gpu), gpu_figures_complete=complete, gpu_work_missing=missing,
                span_ms=span / 1e6 if complete else None,
                busy_ms=busy / 1e6 if complete else None,
                idle_ms=idle / 1e6 if complete else None,
                kernel_ms_by_kind={k: float(by_kind['sum'].get(k, 0.0)) for k in KINDS},
                calls_by_kind={k: int(by_kind['size'].get(k, 0)) for k in KINDS})


def host_figures(cpu, windows, steps):
    """The host's figures per step: launches, CPU time (the windows' time, TTA's and the
    whitening's included, not spent waiting in a synchronization), and inside each kind of range
    (per run for the whitening and the evaluation; not additive: ranges nest)."""
    waits = cpu[cpu.name.isin(SYNCHRONIZATIONS)]
    waiting = union_length(list(zip(waits.start, waits.end)))
    host = sum(stop - start for start, stop in windows) - waiting
    ranges = {kind: union_length(list(zip(rows.start, rows.end))) / 1e6
              for kind, rows in cpu[cpu.range.notna()].groupby('range')}
    return dict(
        kernel_launches_per_step=per_step(int(cpu.name.isin(KERNEL_LAUNCHES).sum()), steps),
        synchronizations=len(waits), waiting_ms=waiting / 1e6,
        cpu_ms_per_step=host / 1e6 / steps,
        cpu_ms_per_step_inside={k: ms / steps for k, ms in ranges.items() if k not in RUN_SOURCES},
        cpu_ms_per_run_inside={k: ms for k, ms in ranges.items() if k in RUN_SOURCES})


def trace_summary(frame, steps):
    """The trace's figures over its timed windows (gpu_figures, host_figures, the graphs')."""
    windows = frame_windows(frame)
    gpu, unlinked = gpu_work_in_windows(frame, windows)
    cpu = host_ranges(frame, windows)
    replays = graph_replays(cpu, gpu)
    return dict(steps=steps, windows=len(windows), unlinked_gpu_activities=len(unlinked),
                graph_launches_per_step=per_step(len(replays), steps),
                graph_kernels_per_step=per_step(int(replays.sum()), steps),
                graph_launches_without_kernels=int((replays == 0).sum()),
                **gpu_figures(gpu, missing_work(replays, unlinked, gpu)),
                **host_figures(cpu, windows, steps))


def kernel_table(gpu):
    """Every kernel (or copy, memset) of the windows: its kind, calls and milliseconds."""
    table = gpu.groupby(['name', 'kind']).ms.agg(calls='size', ms='sum').reset_index()
    return table.sort_values('ms', ascending=False)


# ------------------------------------ Running the scripts ------------------------------------
def resolve(spec):
    """('ours', name) for one of our scripts by name, ('published', path) for a file."""
    if re.fullmatch(r'airbench\w*', spec) and os.path.isfile(os.path.join(REPO, f'{spec}.py')):
        return 'ours', spec
    if spec.endswith('.py') and os.path.isfile(spec):
        return 'published', os.path.abspath(spec)
    ours = sorted(f[:-3] for f in os.listdir(REPO) if re.fullmatch(r'airbench\w*\.py', f))
    sys.exit(f'error: {spec} is neither one of ours ({", ".join(ours)}) nor the path of a '
             'published script')


def load_ours(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_images(real_batch, batch_size):
    """Training images that give batches of batch_size the script's steps per epoch on CIFAR-10."""
    return CIFAR_TRAIN if batch_size is None else CIFAR_TRAIN // real_batch * batch_size


def run_data(options, num_train):
    """{'train', 'test', 'classes', 'mean', 'std'}: uint8 images (N, 32, 32, 3) from --data-dir,
    else random ones, cut to num_train and --test-images."""
    if options.data_dir:
        sys.path.insert(0, REPO)
        from studylib.data import load_study_data
        data = load_study_data('cifar10', options.data_dir)
    else:
        generator = torch.Generator().manual_seed(options.seed)
        data = {split: {'images': torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8,
                                                generator=generator),
                        'labels': torch.randint(0, 10, (n,), generator=generator)}
                for split, n in (('train', num_train), ('test', options.test_images))}
        data.update(classes=[str(c) for c in range(10)], mean=CIFAR_MEAN, std=CIFAR_STD)
    for split, n in (('train', num_train), ('test', options.test_images)):
        data[split] = {key: value[:n] for key, value in data[split].items()}
    return data


def ours_hyp(module, options):
    """(the script's hyp with --batch-size, --widths and --epochs applied, its own batch size)."""
    hyp = {group: dict(values) for group, values in module.hyp.items()}
    real_batch = hyp['opt']['batch_size']
    if options.batch_size:
        hyp['opt']['batch_size'] = options.batch_size
    if options.widths:
        for group in ('net', 'proxy'):
            if group in hyp:
                hyp[group]['widths'] = dict(zip(('block1', 'block2', 'block3'), options.widths))
    if options.epochs:
        hyp['opt']['train_epochs'] = options.epochs
    return hyp, real_batch


def queued_clock(module, recorder):
    """module.DeviceClock as it runs on CUDA, on the host's clock: its first mark opens the
    recorder's window, the host's first wait on an event (its synchronize()) closes it."""
    class Event:
        def __init__(self):
            self.time = time.perf_counter()

        def synchronize(self):
            if recorder.timed:
                recorder.toggle()

        def elapsed_time(self, end):
            return 1000 * (end.time - self.time)

    class QueuedClock(module.DeviceClock):
        def __init__(self, device):
            super().__init__(device)
            self.queued = True

        def mark(self):
            if not self.marks:
                recorder.toggle()
            self.marks.append(Event())
    return QueuedClock


def run_ours(name, options, device, precision, recorder, activities, force_compiles=False):
    """Build the network, warm up as main() does on CUDA, then profile one train(): (its steps,
    its timed seconds, the profile)."""
    module = load_ours(name)
    hyp, real_batch = ours_hyp(module, options)
    data = run_data(options, train_images(real_batch, options.batch_size))
    data.update({s: {k: v.to(device) for k, v in data[s].items()} for s in ('train', 'test')})
    with contextlib.ExitStack() as stack:
        if force_compiles and hasattr(module, 'compiles'):
            set_attribute(stack, module, 'compiles', lambda device: True)
        label_script(stack, vars(module), recorder)
        label_torch(stack)
        net = module.build_net(hyp['net'], len(data['classes']), device, precision)
        torch.backends.cudnn.benchmark = True
        module.warm_up(data, hyp, device, precision, options.seed, net, full=True)
        if hasattr(module, 'DeviceClock'):  # one window on the device's clock, as on CUDA
            set_attribute(stack, module, 'DeviceClock', queued_clock(module, recorder))
        else:
            set_attribute(stack, module, 'time', recorder.clock())
        result, prof = profiled(recorder, lambda: module.train(
            data, hyp, device, precision, options.seed, net, epoch_eval=False), activities)
    if result['steps'] != recorder.batches:
        raise RuntimeError(f"{name}: train() made {result['steps']} steps but its loader yielded "
                           f'{recorder.batches} batches in the timed windows')
    return result['steps'], result['total_time_seconds'], prof


BATCH_SIZES = [re.compile(r'\b(training_batch_size = )(\d+)'),  # hiverge's
               re.compile(r'^(\s+batch_size = )(\d+)$', re.MULTILINE),  # the Muon record's
               re.compile(r"('batch_size': )(\d+)")]  # in hyp, the paper's


def shrunk_source(source, path, options):
    """(the published source with --batch-size, --widths and --epochs in place of its own, its own
    batch size)."""
    found = next((p for p in BATCH_SIZES if p.search(source)), None)
    if found is None:
        sys.exit(f'error: {path}: no batch size found (training_batch_size = N, batch_size = N or '
                 "'batch_size': N)")
    real_batch = int(found.search(source).group(2))
    if options.batch_size:
        source = found.sub(lambda m: f'{m.group(1)}{options.batch_size}', source, count=1)
    for block, width in enumerate(options.widths or [], 1):
        source, n = re.subn(rf"(block{block}'?\s*[=:]\s*)\d+", rf'\g<1>{width}', source, count=1)
        if n == 0:
            sys.exit(f'error: {path}: no block{block} width found to set (--widths)')
    if options.epochs:
        epochs = f'total_train_steps = ceil({options.epochs!r} * len(train_loader))'
        source, n = reference.STEPS_IN_EPOCHS.subn(epochs, source)
        source, m = re.subn(r"('train_epochs': )[0-9.]+", rf'\g<1>{options.epochs!r}', source)
        if n + m == 0:
            sys.exit(f'error: {path}: no schedule found to set (--epochs)')
    return source, real_batch


def write_published_data(workdir, data):
    """The data as the published scripts read it: ./cifar10/{train,test}.pt."""
    os.makedirs(os.path.join(workdir, 'cifar10'), exist_ok=True)
    for split in ('train', 'test'):
        torch.save({**data[split], 'classes': data['classes']},
                   os.path.join(workdir, 'cifar10', f'{split}.pt'))


def clock_event(recorder):
    """torch.cuda.Event's stand-in on a CPU: reference's host-clock Event that toggles the
    recorder's timed windows when recorded."""
    class Event(reference.Event):
        def record(self, *args, **kwargs):
            recorder.toggle()
            super().record()
    return Event


def marked_cuda_event(recorder):
    """torch.cuda.Event, whose record() also marks the recorder's timed windows in the trace."""
    class MarkedEvent(torch.cuda.Event):
        def record(self, stream=None):
            recorder.toggle()
            return super().record(stream)
    return MarkedEvent


def redirect_published(mode, recorder):
    """On a CPU, tools/reference.py's redirection of CUDA; for the count with fp16 and
    torch.compile kept. The CUDA events mark the timed windows."""
    if mode == 'trace-cuda':
        torch.cuda.Event = marked_cuda_event(recorder)
        return
    reference.redirect_cuda_to_cpu()
    torch.cuda.Event = clock_event(recorder)
    if mode == 'count':
        nn.Module.half, torch.Tensor.half = ORIGINAL['module_half'], ORIGINAL['tensor_half']
        nn.Module.compile = ORIGINAL['module_compile']


def measured_main(main, recorder, activities, measured, add_warmup):
    """main(), whose first call that is not the warmup is profiled (after the warmup, where the
    main block lacks the call that main() has)."""
    def main_measured(run, *args, **kwargs):
        if run == 'warmup' or 'profile' in measured:
            return main(run, *args, **kwargs)
        if add_warmup:
            main('warmup', *args, **kwargs)
        measured['result'], measured['profile'] = profiled(
            recorder, lambda: main(run, *args, **kwargs), activities)
        return measured['result']
    return main_measured


def final_entry_kept(print_details, measured):
    """The script's print_training_details, keeping the final entry's variables (its time)."""
    def keep(variables, is_final_entry):
        if is_final_entry:
            measured['final'] = dict(variables)
        return print_details(variables, is_final_entry)
    return keep


def run_published(path, options, recorder, activities, mode):
    """The published script's main block with one timed run, in a temporary working directory of
    its own (its data, its logs): (its steps, its timed seconds, the profile of its timed main()
    call)."""
    with open(path) as f:
        source, real_batch = shrunk_source(f.read(), path, options)
    definitions, block, has_warmup, calls_warmup = reference.split_script(source, path)
    redirect_published(mode, recorder)
    sys.argv, namespace = [path], {'__name__': '__main__', '__file__': path, '__runs__': 1}
    measured = {}
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='profile_run-'))
        write_published_data(workdir, run_data(options, train_images(real_batch,
                                                                    options.batch_size)))
        stack.callback(os.chdir, os.getcwd())
        os.chdir(workdir)
        if mode == 'count':
            stack.enter_context(as_on_cuda(recorder))
        exec(compile(definitions, path, 'exec'), namespace)
        label_script(stack, namespace, recorder)
        label_torch(stack)
        namespace['main'] = measured_main(namespace['main'], recorder, activities, measured,
                                          has_warmup and not calls_warmup)
        namespace['print_training_details'] = final_entry_kept(
            namespace['print_training_details'], measured)
        exec(compile(block, path, 'exec'), namespace)
    if 'profile' not in measured:
        sys.exit(f'error: {path}: its main block made no timed run')
    final = measured.get('final', {})
    return (recorder.batches, final.get('total_time_seconds', final.get('time_seconds')),
            measured['profile'])


def run_flops(kind, target):
    """tools/flops.py's count of a whole run (training steps as run, and TTA), or None where it
    cannot count the script."""
    import flops
    if kind == 'ours':
        return flops.run_flops(flops.load_script(target))['exact']
    try:
        return flops.published_flops(target)['exact']
    except SystemExit:
        return None


# ------------------------------------------ Reporting ------------------------------------------
def markdown(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows])


def count_tables(rows):
    """The count's two tables: the figures of each script, and its eager operators by source."""
    main = markdown(
        ['script', 'steps', 'eager ops/step', 'graph calls/step',
         'graphs compiled (in the run)', 'recompiles', 'host syncs in timed windows',
         'timed windows'],
        [[r['script'], r['steps'], f"{r['eager_ops_per_step']:.2f}",
          f"{r['graph_calls_per_step']:.2f}",
          f"{r['graphs_compiled']} ({r['graphs_compiled_in_run']})", r['recompiles'],
          r['host_syncs_timed'], r['timing_windows']] for r in rows])
    sources = markdown(
        ['script', *[f'{s}/step' for s in STEP_SOURCES], 'whitening/run', 'TTA/run',
         'TTA graph calls/run', 'host syncs in timed windows, by source'],
        [[r['script'], *[f"{r['eager_ops_per_step_by_source'][s]:.2f}" for s in STEP_SOURCES],
          r['eager_ops_per_run']['whitening'], r['eager_ops_per_run']['evaluation'],
          r['graph_calls_per_run']['evaluation'],
          ', '.join(f'{source} {n}' for source, n in sorted(
              r['host_syncs_timed_by_source'].items())) or '-'] for r in rows])
    return main, sources


def gpu_time_line(s):
    """The GPU's busy and idle time over the span, or why they are incomplete (not printed)."""
    found = (f'{s["gpu_activities"]} GPU activities ({s["unlinked_gpu_activities"]} in the trace '
             'not linked to a launch, left out)')
    if not s['gpu_figures_complete']:
        return (f'GPU busy and idle time: incomplete, not printed: '
                f'{"; ".join(s["gpu_work_missing"])}; {found}')
    return (f'GPU span {s["span_ms"]:.1f} ms: busy {s["busy_ms"]:.1f} ms, idle between kernels '
            f'{s["idle_ms"]:.1f} ms; {found}')


def trace_report(name, summary, seconds, flops, peak, device_name):
    """The trace's figures as lines of text (flops: a count, or why there is none)."""
    s = summary
    lines = [f'{name} on {device_name}, torch {torch.__version__}: one timed run, {s["steps"]} '
             f'steps, {s["windows"]} timed windows, {seconds:.3f} s timed (its own timer)',
             gpu_time_line(s),
             'kernel time by kind' + ('' if s['gpu_figures_complete'] else ' (incomplete)')
             + ': ' + ', '.join(f'{kind} {ms:.1f} ms in {s["calls_by_kind"][kind]} calls'
                                for kind, ms in s['kernel_ms_by_kind'].items()),
             f'per step: {s["kernel_launches_per_step"]:.1f} kernel launches, '
             f'{s["graph_launches_per_step"]:.2f} CUDA-graph launches replaying '
             f'{s["graph_kernels_per_step"]:.1f} kernels, copies and memsets, '
             f'{s["cpu_ms_per_step"]:.3f} ms of CPU ({s["synchronizations"]} synchronizations '
             f'waited {s["waiting_ms"]:.1f} ms in all)',
             'CPU ms inside ranges, per step: ' + ', '.join(
                 f'{kind} {ms:.3f}' for kind, ms in sorted(s['cpu_ms_per_step_inside'].items()))
             + '; per run: ' + ', '.join(
                 f'{kind} {ms:.1f}' for kind, ms in sorted(s['cpu_ms_per_run_inside'].items()))]
    if isinstance(flops, str) or peak is None:
        lines.append('FLOP/s: not computed (' + (flops if isinstance(flops, str) else
                     f'no peak known for {device_name}: --peak-tflops') + ')')
    else:
        achieved, fraction = flop_fraction(flops, seconds, peak)
        lines.append(f'FLOPs: {flops / 1e15:.3f} PFLOPs (tools/flops.py) in {seconds:.3f} s = '
                     f'{achieved:.0f} TFLOP/s, {100 * fraction:.1f}% of {peak} TFLOP/s')
    return lines


def write_outputs(out, files):
    """Write {file name: text or a pandas table} into the directory out."""
    os.makedirs(out, exist_ok=True)
    for name, content in files.items():
        path = os.path.join(out, name)
        if isinstance(content, pd.DataFrame):
            content.to_csv(path, index=False)
        else:
            with open(path, 'w') as f:
                f.write(content)


# ----------------------------------------- The commands -----------------------------------------
def count_in_process(spec, options):
    """The count of one script, in this process (a published script's redirections stay)."""
    torch.set_num_threads(1)  # the counts do not depend on it; 2 threads on a shared host crawl
    kind, target = resolve(spec)
    recorder, activities = Recorder(), [ProfilerActivity.CPU]
    if kind == 'ours':
        with as_on_cuda(recorder):
            steps, _, prof = run_ours(target, options, torch.device('cpu'), 'fp16', recorder,
                                      activities, force_compiles=True)
    else:
        steps, _, prof = run_published(target, options, recorder, activities, 'count')
    tally = count_events(prof.events())
    name = target if kind == 'ours' else os.path.basename(target)
    return dict(count_summary(name, tally, steps, recorder), batch_size=options.batch_size,
                widths=options.widths, torch=torch.__version__)


def forwarded(options):
    """The count's options as flags for its per-script processes."""
    flags = ['--test-images', str(options.test_images), '--seed', str(options.seed)]
    if options.as_published:
        flags.append('--as-published')
    else:
        flags += ['--batch-size', str(options.batch_size),
                  '--widths', ','.join(map(str, options.widths))]
    return flags + (['--epochs', str(options.epochs)] if options.epochs else [])


def last_message(stderr):
    """The last line of a process's stderr that is not the profiler's own log."""
    lines = [line for line in stderr.strip().splitlines()
             if not re.match(r'(USDT|ERROR|WARNING|INFO):\d{4}-', line)]
    return lines[-1] if lines else '(no message)'


def count_command(options):
    rows = []
    for spec in options.scripts:
        resolve(spec)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, os.path.abspath(__file__), 'count', spec,
                               '--in-process', *forwarded(options)], capture_output=True,
                              text=True)
        results = [line[len(RESULT_PREFIX):] for line in done.stdout.splitlines()
                   if line.startswith(RESULT_PREFIX)]
        if done.returncode or not results:
            sys.exit(f'error: counting {spec} failed: {last_message(done.stderr)}')
        rows.append(json.loads(results[-1]))
        print(f'counted {spec} in {time.perf_counter() - start:.0f} s', flush=True)
    main, sources = count_tables(rows)
    shape = ('the scripts\' own batch sizes and widths' if options.as_published else
             f'batches of {options.batch_size}, widths {"/".join(map(str, options.widths))}')
    print(f'\ntorch {torch.__version__}, {shape}; per step: over the timed windows\n\n{main}'
          f'\n\neager operators by source, per step and per run:\n\n{sources}')
    if options.out:
        write_outputs(options.out, {'counts.json': json.dumps(rows, indent=2),
                                    'counts.csv': pd.json_normalize(rows)})


def exported_frame(prof, keep_in=None):
    """The profile's events as trace_frame reads them from its Chrome trace: written into the
    folder keep_in (as trace.json) where given, else into a temporary one."""
    with tempfile.TemporaryDirectory(prefix='profile_run-') as scratch:
        folder = keep_in or scratch
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, 'trace.json')
        prof.export_chrome_trace(path)
        return trace_frame(path)


def trace_command(options):
    kind, target = resolve(options.script)
    device = torch.device(options.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        sys.exit(f'error: trace on CUDA needs a GPU, and torch {torch.__version__} sees none '
                 '(--device cpu checks the tool on this CPU, without kernels)')
    recorder = Recorder()
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == 'cuda')
    if kind == 'ours':
        steps, seconds, prof = run_ours(target, options, device,
                                        'fp16' if device.type == 'cuda' else 'fp32', recorder,
                                        activities)
    else:
        mode = 'trace-cuda' if device.type == 'cuda' else 'trace-cpu'
        steps, seconds, prof = run_published(target, options, recorder, activities, mode)
    frame = exported_frame(prof, options.out if options.chrome_trace else None)
    summary = trace_summary(frame, steps)
    shrunk = options.batch_size or options.widths or options.epochs
    flops = 'not counted for a run shrunk by --batch-size, --widths or --epochs' if shrunk else \
        run_flops(kind, target) or 'tools/flops.py does not count this script'
    device_name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU'
    peak = peak_tflops(device_name, options.peak_tflops)
    name = target if kind == 'ours' else os.path.basename(target)
    print('\n'.join(trace_report(name, summary, seconds, flops, peak, device_name)))
    if options.out:
        gpu, _ = gpu_work_in_windows(frame, frame_windows(frame))
        summary.update(script=name, timed_seconds=seconds,
                       flops=None if isinstance(flops, str) else flops, peak_tflops=peak,
                       device=device_name, torch=torch.__version__)
        write_outputs(options.out, {'summary.json': json.dumps(summary, indent=2),
                                    'kernels.csv': kernel_table(gpu)})


def widths(text):
    values = text.split(',')
    if len(values) != 3 or not all(v.isdigit() and int(v) > 0 for v in values):
        raise argparse.ArgumentTypeError(f'{text!r}: three positive widths, e.g. 2,8,8')
    return [int(v) for v in values]


def positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f'{text!r}: a positive number')
        return value
    return parse


def parse_args(argv):
    parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
    commands = parser.add_subparsers(dest='command', required=True)
    trace = commands.add_parser('trace', help='on CUDA: trace one timed run',
                                description='On CUDA: trace one timed run (see the docstring).')
    trace.add_argument('script', help="one of ours by name, or a published script's path")
    trace.add_argument('--device', default='cuda', help='cuda (default), or cpu to check the tool')
    trace.add_argument('--data-dir', help='CIFAR-10 as our scripts take it (default: random '
                       'images of its size)')
    trace.add_argument('--peak-tflops', type=positive(float), help="the GPU's dense fp16 peak "
                       '(default: from PEAK_TFLOPS by its name)')
    trace.add_argument('--chrome-trace', action='store_true', help='also write --out/trace.json')
    trace.add_argument('--batch-size', type=positive(int), help="instead of the script's (a "
                       'check on a CPU); the training images give its steps per epoch')
    trace.add_argument('--widths', type=widths, help="the blocks' widths instead of the "
                       "script's, e.g. 2,8,8")
    count = commands.add_parser('count', help='on a CPU: count what the host dispatches per step',
                                description='On a CPU: count, per training step, what the host '
                                'dispatches as the script runs on CUDA (see the docstring).')
    count.add_argument('scripts', nargs='+', help="ours by name, or published scripts' paths")
    count.add_argument('--batch-size', type=positive(int), default=8, help="instead of the "
                       "script's; the training images give its steps per epoch (default 8)")
    count.add_argument('--widths', type=widths, default=[2, 8, 8], help="the blocks' widths "
                       "instead of the script's (default 2,8,8)")
    count.add_argument('--as-published', action='store_true',
                       help="the script's own batch size and widths (slow on a CPU)")
    count.add_argument('--in-process', action='store_true', help=argparse.SUPPRESS)
    for command in (trace, count):
        command.add_argument('--epochs', type=positive(float), help="the script's schedule "
                             'fitted to E epochs (default: its own)')
        command.add_argument('--test-images', type=positive(int), default=CIFAR_TEST,
                             help=f'test images (default {CIFAR_TEST}, as CIFAR-10)')
        command.add_argument('--seed', type=int, default=0, help="ours' seed and the random "
                             "images' (default 0)")
        command.add_argument('--out', help='a directory for the raw tables (CSV, JSON)')
    options = parser.parse_args(argv)
    options.out = options.out and os.path.abspath(options.out)  # published scripts run elsewhere
    if options.command == 'trace':
        options.data_dir = options.data_dir and os.path.abspath(options.data_dir)
        if options.chrome_trace and not options.out:
            parser.error('--chrome-trace writes OUT/trace.json: give --out OUT')
    if options.command == 'count':
        options.data_dir = None
        if options.as_published:
            options.batch_size = options.widths = None
        if options.in_process and len(options.scripts) != 1:
            parser.error('--in-process counts one script')
    return options


def main(argv=None):
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if options.command == 'trace':
        return trace_command(options)
    if options.in_process:
        summary = count_in_process(options.scripts[0], options)
        return print(RESULT_PREFIX + json.dumps(summary), flush=True)
    count_command(options)


if __name__ == '__main__':
    main()
