"""Run the published Muon record (../shared/reference/airbench94_muon.py) on this CPU, in the
precision our scripts use here, so that airbench94_muon.py can be measured beside it.

The record is CUDA-only: it moves everything to the GPU, stores fp16 weights and images, compiles
the network (max-autotune) and its Newton-Schulz function, and times with CUDA events. Here, and
nothing else changes:
- tensors and modules stay on the CPU; fp16 becomes fp32 (weights and images), as in our CPU recipe;
- the forward pass runs under bf16 autocast where the CPU has native bf16 (else fp32, or as
  --precision says), and its logits are returned in fp32, as our train() does;
- torch.compile is off (our script runs eagerly on the CPU too: inductor's CPU code was slower);
- its CUDA-event timer reads time.perf_counter() at the same points.
Its Newton-Schulz iteration keeps its own bf16. The data: our loader's tensor cache of --data-dir
(load_dataset of airbench94.py), written to the record's ./cifar10/{train,test}.pt.

Usage: python tools/reference_muon.py --data-dir DIR [--runs 1] [--precision auto|bf16|fp32]
           [--workdir /tmp/airbench-muon-reference]
Prints the record's own per-epoch table, then one JSON line per run and a JSON summary line.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, '..', 'shared', 'reference', 'airbench94_muon.py')


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def redirect_cuda_to_cpu():
    """Make the record's CUDA calls run on the CPU in fp32 weights, uncompiled."""
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.half = lambda self: self.float()
    torch.Tensor.half = lambda self, *args, **kwargs: self.float()
    nn.Module.compile = lambda self, *args, **kwargs: None
    torch.compile = lambda function=None, **kwargs: function if function else (lambda f: f)
    load_tensors = torch.load
    torch.load = lambda path, *args, map_location=None, **kwargs: load_tensors(
        path, *args, map_location='cpu', **kwargs)

    class Event:
        def __init__(self, **kwargs):
            self.seconds = None

        def record(self):
            self.seconds = time.perf_counter()

        def elapsed_time(self, end):
            return 1e3 * (end.seconds - self.seconds)

    torch.cuda.Event = Event
    torch.cuda.synchronize = lambda *args, **kwargs: None


def write_record_cache(data_dir, workdir):
    """Our loader's tensors of data_dir as the record's cifar10/train.pt and test.pt."""
    data = load('airbench94', os.path.join(REPO, 'airbench94.py')).load_dataset('cifar10', data_dir)
    os.makedirs(os.path.join(workdir, 'cifar10'), exist_ok=True)
    for split in ('train', 'test'):
        torch.save({'images': data[split]['images'], 'labels': data[split]['labels'],
                    'classes': data['classes']}, os.path.join(workdir, 'cifar10', f'{split}.pt'))


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--data-dir', required=True, help="CIFAR-10 as our scripts' --data-dir")
    parser.add_argument('--runs', type=int, default=1)
    parser.add_argument('--precision', choices=['auto', 'bf16', 'fp32'], default='auto')
    parser.add_argument('--workdir', default='/tmp/airbench-muon-reference')
    args = parser.parse_args()
    native_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    precision = args.precision if args.precision != 'auto' else 'bf16' if native_bf16 else 'fp32'

    write_record_cache(os.path.abspath(args.data_dir), args.workdir)
    redirect_cuda_to_cpu()
    sys.argv[0] = os.path.abspath(sys.argv[0])  # the record reads its own source from argv[0]
    os.chdir(args.workdir)  # the record reads ./cifar10/{train,test}.pt
    record = load('airbench94_muon_record', RECORD)
    forward = record.CifarNet.forward

    def forward_in_precision(self, x, whiten_bias_grad=True):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=(precision == 'bf16')):
            return forward(self, x, whiten_bias_grad).float()
    record.CifarNet.forward = forward_in_precision

    timed_seconds, print_details = [], record.print_training_details
    def keep_timed_seconds(variables, is_final_entry):
        if is_final_entry:
            timed_seconds.append(variables['time_seconds'])
        return print_details(variables, is_final_entry)
    record.print_training_details = keep_timed_seconds

    print(f'record precision: {precision}, torch {torch.__version__}', flush=True)
    model = record.CifarNet().cuda().to(memory_format=torch.channels_last)
    record.print_columns(record.logging_columns_list, is_head=True)
    record.main('warmup', model)
    accs, walls = [], []
    for run in range(args.runs):
        start = time.perf_counter()
        accs.append(record.main(run, model))
        walls.append(time.perf_counter() - start)
        print(json.dumps({'run': run, 'tta_acc': accs[-1], 'timed_seconds': timed_seconds[-1],
                          'wall_seconds': walls[-1]}), flush=True)
    print(json.dumps({'runs': args.runs, 'precision': precision,
                      'mean_tta_acc': sum(accs) / len(accs),
                      'mean_timed_seconds': sum(timed_seconds[1:]) / len(accs),
                      'mean_wall_seconds': sum(walls) / len(walls), 'torch': torch.__version__}))


if __name__ == '__main__':
    main()
