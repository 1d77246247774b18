"""tools/reference.py on stand-ins for the published scripts, CUDA-only as written: run on the CPU
in our precision, with --runs, --epochs, a warmup and --seed as documented."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

# What every published script has: it reads its own source, and prints each run's details (here
# with draws from torch's and Python's generators, which the published scripts leave unseeded)
PUBLISHED = '''
import random
import sys
from math import ceil
import torch
from torch import nn

with open(sys.argv[0]) as f:
    code = f.read()

def print_training_details(variables, is_final_entry):
    print('final' if is_final_entry else 'epoch', variables['run'])
    print('draws', torch.rand(1).item(), random.random())
'''
# The paper's: hyp, .half().cuda(), torch.compile, CUDA events, ./cifar10/*.pt, range(25) runs
AIRBENCH94 = PUBLISHED + '''
hyp = {'opt': {'train_epochs': 9.9}}

def make_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4)).half().cuda()

def main(run, model):
    data = torch.load('cifar10/train.pt', map_location='cuda')
    images = (data['images'].half() / 255).permute(0, 3, 1, 2).cuda()
    labels = data['labels'] if run != 'warmup' else torch.zeros_like(data['labels'])
    starter, ender = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    starter.record()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = ceil(hyp['opt']['train_epochs'] * 2)
    for step in range(steps):
        outputs = model(images)
        nn.functional.cross_entropy(outputs, labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    ender.record()
    torch.cuda.synchronize()
    total_time_seconds = 1e-3 * starter.elapsed_time(ender)
    tta_val_acc = (model(images).argmax(1) == labels).float().mean().item()
    print('weights', model._orig_mod[1].weight.dtype, 'outputs', outputs.dtype, 'steps', steps)
    print_training_details(locals(), is_final_entry=True)
    return tta_val_acc

if __name__ == '__main__':
    model = torch.compile(make_net(), mode='max-autotune')
    accs = torch.tensor([main(run, model) for run in range(25)])
'''
# hiverge's: no hyp (its schedule in total_train_steps), tensors made with device='cuda', a
# network whose forward takes a second argument, its own warmup call
HIVERGE = PUBLISHED + '''
class CifarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32, 4)
        for mod in self.modules():
            mod.half()

    def forward(self, x, whiten_bias_grad=True):
        return self.head(x.flatten(1))

def main(run, model):
    data = torch.load('cifar10/train.pt', map_location=torch.device('cuda'), weights_only=True)
    images = (data['images'].half() / 255).permute(0, 3, 1, 2)
    labels = data['labels']
    train_loader = [None, None]
    total_train_steps = ceil(7.65 * len(train_loader))
    whiten_bias_train_steps = ceil(0.2 * len(train_loader))
    order = torch.empty(len(images), dtype=torch.long, device='cuda')
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(total_train_steps):
        torch.randperm(len(images), out=order)
        outputs = model(images[order], whiten_bias_grad=step < whiten_bias_train_steps)
        nn.functional.cross_entropy(outputs, labels[order]).backward()
        optimizer.step()
        optimizer.zero_grad()
    time_seconds = 1.0
    tta_val_acc = (model(images).argmax(1) == labels).float().mean().item()
    print('steps', total_train_steps, whiten_bias_train_steps, 'order', order.device,
          'outputs', outputs.dtype)
    print_training_details(locals(), is_final_entry=True)

if __name__ == '__main__':
    model = CifarNet().cuda().to(memory_format=torch.channels_last)
    model.compile(mode='max-autotune')
    main('warmup', model)
    for run in range(200):
        main(run + 1, model)
'''


def run_tool(source, data_dir, tmp_path, *flags):
    """The lines the tool prints running this stand-in, which must succeed."""
    script = tmp_path / 'published.py'
    script.write_text(source)
    result = subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'reference.py'),
                             str(script), '--data-dir', data_dir, '--workdir',
                             str(tmp_path / 'work'), *flags],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def starting(lines, word):
    return [line for line in lines if line.startswith(word)]


@pytest.mark.slow
@pytest.mark.parametrize('source, fitted, finals, unfitted', [
    # fp32 weights and logits (bf16 autocast), 4 steps in 2 epochs, a warmup; unfitted, hyp's 9.9
    (AIRBENCH94, 'weights torch.float32 outputs torch.float32 steps 4',
     ['final warmup', 'final 0', 'final 1'],
     'weights torch.float32 outputs torch.float32 steps 20'),
    # 2 epochs of 2 batches (the bias's 0.2 epochs kept), its own warmup, once; unfitted, 7.65
    (HIVERGE, 'steps 4 1 order cpu outputs torch.float32', ['final warmup', 'final 1', 'final 2'],
     'steps 16 1 order cpu outputs torch.float32')], ids=['paper', 'hiverge'])
def test_a_cuda_only_script_runs_on_the_cpu_in_our_precision_and_schedule(
        source, fitted, finals, unfitted, image_folder, tmp_path):
    lines = run_tool(source, image_folder, tmp_path, '--runs', '2', '--epochs', '2',
                     '--precision', 'bf16')
    assert lines.count(fitted) == 3
    assert starting(lines, 'final') == finals
    runs = [json.loads(line) for line in starting(lines, '{"run"')]
    assert [run['run'] for run in runs] == [0, 1]
    assert all(run['timed_seconds'] > 0 and 0 <= run['tta_acc'] <= 1 for run in runs)
    summary = json.loads(lines[-1])
    assert summary['runs'] == 2 and summary['epochs'] == 2 and summary['precision'] == 'bf16'
    assert summary['warmup'] == (source is AIRBENCH94)  # the tool's: hiverge calls its own
    assert summary['mean_tta_acc'] == sum(run['tta_acc'] for run in runs) / 2
    lines = run_tool(source, image_folder, tmp_path, '--no-warmup')
    assert starting(lines, 'final') == finals[1:2]
    assert unfitted in lines


@pytest.mark.slow
def test_seed_sets_the_draws_of_a_script_that_seeds_nothing(image_folder, tmp_path):
    def draws(*flags):
        lines = run_tool(AIRBENCH94, image_folder, tmp_path, '--no-warmup', '--epochs', '1', *flags)
        return starting(lines, 'draws'), json.loads(lines[-1])['seed']
    first, seed = draws('--seed', '1')
    assert seed == 1 and draws('--seed', '1')[0] == first
    assert draws('--seed', '2')[0] != first
    assert draws()[0] != draws()[0]  # unseeded, each process draws its own
    assert draws('--runs', '2', '--seed', '1')[0][1] != first[0]
