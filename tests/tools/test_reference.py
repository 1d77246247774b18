"""tools/reference.py on a stand-in for a published script: CUDA-only as they are written (.cuda(),
.half(), torch.compile, CUDA events, ./cifar10/*.pt, a main block of range(25) runs); the tool runs
it on the CPU in our precision, with --runs runs, --epochs and a warmup as documented."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

STAND_IN = '''
import sys
from math import ceil
import torch
from torch import nn

with open(sys.argv[0]) as f:
    code = f.read()
hyp = {'opt': {'train_epochs': 9.9}}

def make_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4)).half().cuda()

def print_training_details(variables, is_final_entry):
    print('final' if is_final_entry else 'epoch', variables['run'])

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


def run_tool(script, data_dir, workdir, *flags):
    return subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'reference.py'), script,
                           '--data-dir', data_dir, '--workdir', workdir, *flags],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_cuda_only_script_runs_on_the_cpu_in_our_precision(image_folder, tmp_path):
    script = tmp_path / 'published.py'
    script.write_text(STAND_IN)
    result = run_tool(str(script), image_folder, str(tmp_path / 'work'), '--runs', '2',
                      '--epochs', '2', '--precision', 'bf16')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # fp32 weights, bf16 autocast returning fp32 logits, 4 steps for 2 epochs, a warmup first
    assert lines.count('weights torch.float32 outputs torch.float32 steps 4') == 3
    assert [line for line in lines if line.startswith('final')] == [
        'final warmup', 'final 0', 'final 1']
    runs = [json.loads(line) for line in lines if line.startswith('{"run"')]
    assert [run['run'] for run in runs] == [0, 1]
    assert all(run['timed_seconds'] > 0 and 0 <= run['tta_acc'] <= 1 for run in runs)
    summary = json.loads(lines[-1])
    assert summary['runs'] == 2 and summary['epochs'] == 2 and summary['warmup']
    assert summary['precision'] == 'bf16'
    assert summary['mean_tta_acc'] == sum(run['tta_acc'] for run in runs) / 2
    result = run_tool(str(script), image_folder, str(tmp_path / 'work'), '--no-warmup')
    assert [line for line in result.stdout.splitlines() if line.startswith('final')] == ['final 0']
    assert 'steps 20' in result.stdout  # hyp's 9.9 epochs


# The shape of hiverge's published script: no hyp (its schedule in total_train_steps), tensors made
# with device='cuda', a network whose forward takes a second argument, its own warmup call
HIVERGE_STAND_IN = '''
import sys
from math import ceil
import torch
from torch import nn

with open(sys.argv[0]) as f:
    code = f.read()

class CifarNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32, 4)
        for mod in self.modules():
            mod.half()

    def forward(self, x, whiten_bias_grad=True):
        return self.head(x.flatten(1))

def print_training_details(variables, is_final_entry):
    print('final' if is_final_entry else 'epoch', variables['run'])

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


@pytest.mark.slow
def test_a_script_without_hyp_making_cuda_tensors_runs_with_its_schedule_fitted(image_folder,
                                                                                tmp_path):
    script = tmp_path / 'published.py'
    script.write_text(HIVERGE_STAND_IN)
    result = run_tool(str(script), image_folder, str(tmp_path / 'work'), '--runs', '2',
                      '--epochs', '2', '--precision', 'bf16')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # 2 epochs of 2 batches; the whitening bias's 0.2 epochs untouched; its own warmup, once
    assert lines.count('steps 4 1 order cpu outputs torch.float32') == 3
    assert [line for line in lines if line.startswith('final')] == ['final warmup', 'final 1',
                                                                   'final 2']
    result = run_tool(str(script), image_folder, str(tmp_path / 'work'), '--no-warmup')
    assert [line for line in result.stdout.splitlines() if line.startswith('final')] == ['final 1']
    assert 'steps 16 1 order cpu' in result.stdout  # its 7.65 epochs


# Draws from torch's and Python's generators, as the published scripts make them unseeded
DRAWING_STAND_IN = '''
import random
import torch
from torch import nn

def make_net():
    return nn.Linear(2, 2).cuda()

def print_training_details(variables, is_final_entry):
    pass

def main(run, model):
    total_time_seconds, tta_val_acc = 1.0, 0.5
    print('draws', torch.rand(1).item(), random.random())
    print_training_details(locals(), is_final_entry=True)

if __name__ == '__main__':
    model = make_net()
    for run in range(25):
        main(run, model)
'''


@pytest.mark.slow
def test_seed_sets_the_draws_of_a_script_that_seeds_nothing(image_folder, tmp_path):
    script = tmp_path / 'published.py'
    script.write_text(DRAWING_STAND_IN)
    def draws(*flags):
        result = run_tool(str(script), image_folder, str(tmp_path / 'work'), '--no-warmup', *flags)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        return [line for line in lines if line.startswith('draws')], json.loads(lines[-1])['seed']
    first, seed = draws('--seed', '1')
    assert seed == 1 and draws('--seed', '1')[0] == first
    assert draws('--seed', '2')[0] != first
    assert draws()[0] != draws()[0]  # unseeded, each process draws its own
    assert draws('--runs', '2', '--seed', '1')[0][1] != first[0]
