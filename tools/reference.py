"""Run a published airbench script on this CPU, in the precision our scripts use here, so that ours
can be measured beside it on the same machine and data.

Where to get them: the authors' repository, https://github.com/KellerJordan/cifar10-airbench. The
paper's scripts are airbench94.py, airbench94_compiled.py, airbench95.py and airbench96.py at
commit 04512094b7341d95ed02f697c5f5db404556137e (docs/cpu.md, "The published scripts"); the later
records are airbench94_muon.py (commit f1c599c) and airbench96_faster.py; the fastest 94% method is
hiverge/cifar10-speedrun's cifar10_speedrun.py (https://github.com/hiverge/cifar10-speedrun, commit
06c6072). Download the one you want and give its path; this tool runs the published file itself,
so its name does not matter.

They are CUDA-only as written. Here, and nothing else changes:
- tensors and modules stay on the CPU (.cuda() returns them as they are, torch.load maps to the
  CPU, tensors made with device='cuda' are made on the CPU); fp16 becomes fp32 (.half() of modules
  and tensors), as in our CPU recipe; a dtype the script names itself stays (hiverge's fp16 Muon
  momentum);
- the network's forward pass (what make_net returns, or CifarNet's) runs under bf16 autocast where
  the CPU has native bf16, else in fp32 (or as --precision says), and returns fp32 logits, as our
  train() does there; what the script computes in its own dtype (the Muon record's bf16
  Newton-Schulz) keeps it;
- torch.compile and nn.Module.compile compile nothing (our scripts run eagerly on the CPU:
  inductor's CPU code was slower); a compiled module is the module itself, reachable as ._orig_mod;
- CUDA events read time.perf_counter() at the same points; torch.cuda.synchronize, empty_cache and
  _sleep do nothing;
- --seed S seeds torch's and Python's generators with S before the script runs, which makes a run
  of a published script repeatable on a CPU (they seed nothing, or from an unseeded generator, so
  without --seed each run draws its own seed);
- --epochs E sets the script's hyp['opt']['train_epochs'] as our --epochs sets ours (the Muon
  record and hiverge's script have no hyp: the 8 of total_train_steps = ceil(8 *
  len(train_loader)), or its 7.65, becomes E);
- the script's main block runs as written, but its loop over runs (range(N) there) makes --runs
  runs; with --warmup (the default; our scripts always warm up) an untimed main('warmup', ...) on
  dummy labels comes first where main() has one and the block does not call it (the paper's 94,
  95 and 96 have that call commented out); with --no-warmup no warmup runs at all. airbench96_faster.py's
  main() has no warmup run, so none runs there.
Its data: the study engine's tensor cache of --data-dir (studylib.data.load_study_data), written as the
script's ./cifar10/{train,test}.pt in --workdir, where its logs go too.

Usage: python tools/reference.py SCRIPT.py --data-dir DIR [--runs 1] [--seed S] [--epochs E]
           [--precision auto|bf16|fp32] [--no-warmup] [--workdir /tmp/airbench-reference]
e.g.   python tools/reference.py ~/cifar10-airbench/airbench96_faster.py --data-dir DIR --runs 2
Prints the script's own per-epoch table, then one JSON line per run and a JSON summary line (mean
TTA accuracy and timed seconds, the script's own timer).
"""
import argparse
import ast
import json
import os
import random
import re
import sys
import time

import torch
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The schedule of the scripts without hyp (the Muon record's 8 epochs, hiverge's 7.65)
STEPS_IN_EPOCHS = re.compile(r'total_train_steps = ceil\(([0-9.]+) \* len\(train_loader\)\)')
FACTORIES = ('empty', 'zeros', 'ones', 'full', 'rand', 'randn', 'randint', 'randperm', 'arange',
             'tensor')


class Uncompiled(nn.Module):
    """What torch.compile returns here: the module, run eagerly, kept as ._orig_mod as a compiled
    module keeps it (the scripts reach the whitening layer through it)."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module

    def forward(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)


def uncompiled(model=None, **kwargs):
    """torch.compile's stand-in, also as a decorator with or without arguments."""
    if model is None:
        return lambda function: uncompiled(function)
    return Uncompiled(model) if isinstance(model, nn.Module) else model


class Event:
    """torch.cuda.Event's stand-in: the host clock, read where the script records the event."""

    def __init__(self, **kwargs):
        self.seconds = None

    def record(self):
        self.seconds = time.perf_counter()

    def elapsed_time(self, end):
        return 1e3 * (end.seconds - self.seconds)


def made_on_the_cpu(factory):
    """A tensor factory that makes on the CPU what it is asked to make on a CUDA device."""
    def factory_on_the_cpu(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == 'cuda':
            device = 'cpu'
        return factory(*args, device=device, **kwargs)
    return factory_on_the_cpu


def redirect_cuda_to_cpu():
    """Make the script's CUDA calls run on the CPU, in fp32 weights, uncompiled."""
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    for name in FACTORIES:
        setattr(torch, name, made_on_the_cpu(getattr(torch, name)))
    nn.Module.half = lambda self: self.float()
    torch.Tensor.half = lambda self, *args, **kwargs: self.float()
    nn.Module.compile = lambda self, *args, **kwargs: None
    torch.compile = uncompiled
    load_tensors = torch.load
    torch.load = lambda path, *args, map_location=None, **kwargs: load_tensors(
        path, *args, map_location='cpu', **kwargs)
    torch.cuda.Event = Event
    for name in ('synchronize', 'empty_cache', '_sleep'):
        setattr(torch.cuda, name, lambda *args, **kwargs: None)


def in_precision(forward, bf16):
    """forward under bf16 autocast (or none), returning fp32, as our train() runs the network."""
    def forward_in_precision(*args, **kwargs):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            return forward(*args, **kwargs).float()
    return forward_in_precision


def write_script_cache(data_dir, workdir):
    """The study engine's tensors of data_dir as the script's cifar10/train.pt and test.pt."""
    sys.path.insert(0, REPO)
    from studylib.data import load_study_data
    data = load_study_data('cifar10', data_dir)
    os.makedirs(os.path.join(workdir, 'cifar10'), exist_ok=True)
    for split in ('train', 'test'):
        torch.save({'images': data[split]['images'], 'labels': data[split]['labels'],
                    'classes': data['classes']}, os.path.join(workdir, 'cifar10', f'{split}.pt'))


class RunsLoop(ast.NodeTransformer):
    """range(N) in the main block, the loop over runs, becomes range(__runs__)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == 'range' and len(node.args) == 1:
            node.args = [ast.Name('__runs__', ast.Load())]
        return node


def split_script(source, path):
    """(the definitions, the main block's statements with --runs runs, whether main() has a warmup
    run, whether the main block calls it)."""
    tree = ast.parse(source, path)
    main_blocks = [node for node in tree.body if isinstance(node, ast.If)
                   and ast.unparse(node.test).replace('"', "'") == "__name__ == '__main__'"]
    mains = [node for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name == 'main']
    if len(main_blocks) != 1 or len(mains) != 1:
        sys.exit(f'{path}: not a published airbench script (one main() and one '
                 "`if __name__ == '__main__':` block expected)")
    definitions = ast.Module([node for node in tree.body if node is not main_blocks[0]], [])
    block = ast.fix_missing_locations(ast.Module(
        [RunsLoop().visit(node) for node in main_blocks[0].body], []))

    def says_warmup(node):
        return any(isinstance(n, ast.Constant) and n.value == 'warmup' for n in ast.walk(node))
    return definitions, block, says_warmup(mains[0]), says_warmup(main_blocks[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('script', help='path of the published script (see above)')
    parser.add_argument('--data-dir', required=True, help="CIFAR-10 as our scripts' --data-dir")
    parser.add_argument('--runs', type=int, default=1)
    parser.add_argument('--seed', type=int, help="torch's and Python's generators' seed (above)")
    parser.add_argument('--epochs', type=float, help="the script's schedule fitted to E epochs")
    parser.add_argument('--precision', choices=['auto', 'bf16', 'fp32'], default='auto')
    parser.add_argument('--warmup', action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument('--workdir', default='/tmp/airbench-reference')
    args = parser.parse_args()
    path = os.path.abspath(args.script)
    sys.path.insert(0, REPO)
    from studylib.device import resolve_device_precision
    precision = resolve_device_precision('cpu', args.precision)[1]  # auto: our scripts' choice
    with open(path) as f:
        source = f.read()
    if args.runs < 1:
        parser.error(f'--runs must be at least 1, not {args.runs}')
    shortened = args.epochs is not None and STEPS_IN_EPOCHS.search(source) is not None
    if shortened:
        source = STEPS_IN_EPOCHS.sub(
            f'total_train_steps = ceil({args.epochs!r} * len(train_loader))', source)
    definitions, block, has_warmup, calls_warmup = split_script(source, path)

    write_script_cache(os.path.abspath(args.data_dir), args.workdir)
    redirect_cuda_to_cpu()
    sys.argv = [path]  # the scripts read their own source from argv[0]
    os.chdir(args.workdir)  # and the data from ./cifar10/
    script = {'__name__': '__main__', '__file__': path, '__runs__': args.runs}
    if args.seed is not None:
        torch.manual_seed(args.seed)
        random.seed(args.seed)
    exec(compile(definitions, path, 'exec'), script)

    if args.epochs is not None:
        if 'train_epochs' in script.get('hyp', {}).get('opt', {}):
            script['hyp']['opt']['train_epochs'] = args.epochs
        elif not shortened:
            sys.exit(f"{path}: neither hyp['opt']['train_epochs'] nor total_train_steps = "
                     'ceil(EPOCHS * len(train_loader)): --epochs cannot shorten this script')
    bf16 = precision == 'bf16'
    if 'make_net' in script:
        make_net = script['make_net']
        def make_net_in_precision(*net_args, **net_kwargs):
            net = make_net(*net_args, **net_kwargs)
            net.forward = in_precision(net.forward, bf16)
            return net
        script['make_net'] = make_net_in_precision
    elif 'CifarNet' in script:
        network = script['CifarNet']
        network.forward = in_precision(network.forward, bf16)
    else:
        sys.exit(f'{path}: no make_net() or CifarNet, the networks this tool runs in our precision')

    final_entries = []
    print_details = script['print_training_details']
    def keep_final_entry(variables, is_final_entry):
        if is_final_entry:
            final_entries.append(variables)
        return print_details(variables, is_final_entry)
    script['print_training_details'] = keep_final_entry

    results = []
    script_main = script['main']
    add_warmup = args.warmup and has_warmup and not calls_warmup
    def measured_main(run, *main_args, **main_kwargs):
        nonlocal add_warmup
        if run == 'warmup' and not args.warmup:
            return None
        if add_warmup:  # before the first run, untimed
            add_warmup = False
            script_main('warmup', *main_args, **main_kwargs)
        start = time.perf_counter()
        returned = script_main(run, *main_args, **main_kwargs)
        wall_seconds = time.perf_counter() - start
        if run != 'warmup':
            variables = final_entries[-1]
            timed = variables.get('total_time_seconds', variables.get('time_seconds'))
            results.append({'run': len(results), 'tta_acc': variables['tta_val_acc'],
                            'timed_seconds': timed, 'wall_seconds': wall_seconds})
            print(json.dumps(results[-1]), flush=True)
        return returned
    script['main'] = measured_main

    print(f'{os.path.basename(path)} on the CPU: precision {precision}, torch {torch.__version__}',
          flush=True)
    exec(compile(block, path, 'exec'), script)
    mean = lambda key: sum(r[key] for r in results) / len(results)
    print(json.dumps({'script': os.path.basename(path), 'runs': len(results),
                      'seed': args.seed, 'epochs': args.epochs, 'precision': precision,
                      'warmup': args.warmup and has_warmup, 'mean_tta_acc': mean('tta_acc'),
                      'mean_timed_seconds': mean('timed_seconds'),
                      'mean_wall_seconds': mean('wall_seconds'), 'torch': torch.__version__}))


if __name__ == '__main__':
    main()
