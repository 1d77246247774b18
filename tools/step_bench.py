"""Time one training step (forward, summed label-smoothed loss, backward, SGD step) of a script's
network at the paper's batch size, eager and compiled, and optionally profile it. For the Muon
scripts every parameter is under SGD here: the modes compare the network's forward and backward.

A benchmark, not a test: it prints seconds per step (median of --steps after --warmup steps) and,
with --profile, the operators that take the time. Random inputs of the real shape; the whitening
bias trainable (the first 3 epochs) or frozen (--frozen-bias, the rest).

Modes: eager; compiled (as the script compiles it); and, to test what inductor does best on the CPU,
compiled with some operators left to ATen inside the graph (their inductor decompositions removed):
compiled-aten-bn (BatchNorm forward and backward), compiled-aten-bn-maxpool (and max-pool backward).
Several modes are timed round robin, one step of each in turn, so that the host's drift (single
steps vary by 10% here) falls on all of them alike.

Usage: python tools/step_bench.py [--script airbench94] [--mode eager,compiled,...]
                                  [--steps 5] [--profile] [--batch-size 1024]
       python tools/step_bench.py --script airbench94_hiverge --newton-schulz bfloat16,float32
           (a Muon script's orthogonalization of one step alone, per dtype and --mode)
"""
import argparse
import functools
import importlib
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from studylib.device import keep_freed_memory_in_process, resolve_device_precision  # noqa: E402


def build(module, device, precision, batch_size):
    hyp = module.hyp
    arch, opt = hyp['net'], hyp['opt']
    net = module.build_net(arch, 10, device, precision)
    torch.manual_seed(0)
    module.reinitialize(net)
    if hasattr(module, 'decoupled_sgd_groups'):
        params = module.decoupled_sgd_groups(net, opt['lr'], opt['weight_decay'], opt['momentum'],
                                             batch_size, opt['bias_scaler'])
    else:  # a Muon script: every parameter under SGD here (the modes compare the network's step)
        params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-4, momentum=opt['momentum'], nesterov=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=opt['label_smoothing'], reduction='sum')
    dtype = torch.float16 if precision == 'fp16' else torch.float32
    inputs = torch.randn(batch_size, 3, 32, 32, device=device, dtype=dtype)
    inputs = inputs.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch_size,), device=device)
    return net, optimizer, loss_fn, inputs, labels


ATEN_INSIDE_GRAPH = {
    'compiled-aten-bn': ['_native_batch_norm_legit_functional', 'native_batch_norm_backward'],
    'compiled-aten-bn-maxpool': ['_native_batch_norm_legit_functional', 'native_batch_norm_backward',
                                 'max_pool2d_with_indices_backward'],
}
MODES = ['eager', 'compiled', *ATEN_INSIDE_GRAPH]


def compile_for_mode(module, net, device, mode):
    """Compile net in place as `mode` says: as the script does, or with inductor's decompositions
    of some ATen operators removed, so that inductor calls the ATen kernels for them."""
    if mode == 'compiled':  # as airbench94_compiled.build_net compiles
        net.forward = torch.compile(net.forward, mode='max-autotune' if device.type == 'cuda'
                                    else None, dynamic=False)
        return
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table
    kept_in_aten = {getattr(torch.ops.aten, name).default for name in ATEN_INSIDE_GRAPH[mode]}
    table = {op: fn for op, fn in select_decomp_table().items() if op not in kept_in_aten}
    net.forward = torch.compile(net.forward,
                                backend=functools.partial(compile_fx, decompositions=table))


def training_step(module, device, precision, batch_size, frozen_bias, mode, autocast):
    """One training step of the script's network on random data, eager or compiled per mode."""
    net, optimizer, loss_fn, inputs, labels = build(module, device, precision, batch_size)
    net[0].bias.requires_grad = not frozen_bias
    if mode != 'eager':
        compile_for_mode(module, net, device, mode)
    return make_step(net, optimizer, loss_fn, inputs, labels, autocast)


def orthogonalization_step(module, device, dtype, compiled):
    """One Muon step's orthogonalization as the script runs it, on random updates:
    airbench94_hiverge's of its six filter banks zero-padded to one shape, airbench94_muon's bank
    by bank."""
    arch = module.hyp['net']
    net = module.make_net(arch['widths'], 10, arch['batchnorm_momentum'], arch['scaling_factor'])
    shapes = [(p.size(0), p[0].numel()) for p in net.parameters()
              if p.ndim == 4 and p.requires_grad]
    steps = module.hyp['opt']['newton_schulz_steps']
    orthogonalize = module.orthogonalize
    if compiled:
        orthogonalize = torch.compile(orthogonalize, dynamic=False)
    if 'renormalization_steps' in vars(module):  # all banks at once
        rows, cols = max(r for r, _ in shapes), max(c for _, c in shapes)
        padded = torch.randn(len(shapes), rows, cols, device=device, dtype=dtype)
        return lambda: orthogonalize(padded, steps)
    updates = [torch.randn(shape, device=device) for shape in shapes]
    return lambda: [orthogonalize(update, steps, dtype) for update in updates]


def peak_resident_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def make_step(net, optimizer, loss_fn, inputs, labels, autocast):
    def step():
        with autocast:
            outputs = net(inputs)
        loss = loss_fn(outputs.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def synchronized_time(device):
    """The clock (seconds) once the device has done its queued work (CUDA runs asynchronously)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    return time.perf_counter()


def time_round_robin(module, steps_by_mode, device, warmup, steps):
    """Seconds per step for each mode: `warmup` untimed steps each (compilation happens there),
    then `steps` rounds of one timed step per mode."""
    for step in steps_by_mode.values():
        for _ in range(warmup):
            step()
    seconds = {mode: [] for mode in steps_by_mode}
    for _ in range(steps):
        for mode, step in steps_by_mode.items():
            start = synchronized_time(device)
            step()
            seconds[mode].append(synchronized_time(device) - start)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--script', default='airbench94')
    parser.add_argument('--mode', default='eager,compiled',
                        help=f'comma-separated, timed round robin; of {", ".join(MODES)} '
                             '(both = eager,compiled)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--precision', default='auto')
    parser.add_argument('--batch-size', type=int, default=1024)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--frozen-bias', action='store_true')
    parser.add_argument('--profile', action='store_true')
    parser.add_argument('--glibc-malloc-defaults', action='store_true',
                        help="skip studylib's keep_freed_memory_in_process (glibc's defaults)")
    parser.add_argument('--newton-schulz', metavar='DTYPES', help="a Muon script's "
                        'orthogonalization of one step instead, in each dtype (e.g. '
                        'bfloat16,float32), per --mode')
    args = parser.parse_args()

    module = importlib.import_module(args.script)
    if args.script == 'airbench94_compiled':
        parser.error('use --script airbench94 --mode compiled: this tool compiles per --mode')
    device, precision = resolve_device_precision(args.device, args.precision)
    if not args.glibc_malloc_defaults:
        keep_freed_memory_in_process()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=(precision == 'bf16'))
    modes = ['eager', 'compiled'] if args.mode == 'both' else args.mode.split(',')
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f'unknown --mode {",".join(unknown)}: choose from {", ".join(MODES)}')
    dtypes = args.newton_schulz.split(',') if args.newton_schulz else []
    if any(not isinstance(getattr(torch, dtype, None), torch.dtype) for dtype in dtypes):
        parser.error(f'--newton-schulz {args.newton_schulz}: torch dtypes, e.g. bfloat16,float32')
    print(f'{args.script}: batch {args.batch_size}, {device}, precision {precision}, '
          f'threads {torch.get_num_threads()}, '
          f'glibc malloc {"defaults" if args.glibc_malloc_defaults else "keeping freed memory"}, '
          f'whitening bias '
          f'{"frozen" if args.frozen_bias else "trainable"}')
    if args.newton_schulz:
        steps_by_mode = {f'{dtype} {mode}': orthogonalization_step(
            module, device, getattr(torch, dtype), mode != 'eager')
            for dtype in dtypes for mode in modes}
    else:
        steps_by_mode = {mode: training_step(module, device, precision, args.batch_size,
                                             args.frozen_bias, mode, autocast) for mode in modes}
    seconds = time_round_robin(module, steps_by_mode, device, args.warmup, args.steps)
    for mode in steps_by_mode:
        print(f'{mode:24s} median {statistics.median(seconds[mode]):.3f} s/step  '
              f'min {min(seconds[mode]):.3f}  max {max(seconds[mode]):.3f}  '
              f'(n {len(seconds[mode])})')
    print(f'peak resident memory {peak_resident_gib():.2f} GiB')
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for mode, step in steps_by_mode.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            print(f'{mode}:')
            print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=25))

if __name__ == '__main__':
    main()
