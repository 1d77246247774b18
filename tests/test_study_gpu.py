"""study.py on a GPU, checked without one (issue 41): the engine's whole device path under a stand-in
for the CUDA driver that keeps torch's own rules (tests/cuda_stand_in.py): --device auto, cuda and
cuda:N at world sizes 1 and 2, setup_process, prepare_device and the environment record; a GPU past
the last refused in one line; a run that fails with a CUDA error still recorded. What a GPU would
compile: the saved outputs evaluated as the method evaluates, every forward pass of a run met in
the warmup, one network per architecture."""
import glob
import json
import os
import types

import pytest
import torch

from conftest import REPO, load_script
from cuda_stand_in import GPU_NAME, cuda_stand_in, needs_cuda_build
from test_study import records, study_main, training  # noqa: F401

load_script('study')  # puts the repository on the path
import studylib.runs  # noqa: E402
import studylib.scripts  # noqa: E402
from studylib import cli  # noqa: E402
from studylib.device import prepare_device  # noqa: E402
from studylib.environment import world_environment  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.launch import device_failure, train_one  # noqa: E402
from studylib.records import FailedTry  # noqa: E402
from studylib.setup import setup_process  # noqa: E402



def study_args(image_folder, device):
    return cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'unused', '--',
                           '--dataset', 'folder', '--data-dir', image_folder, '--device', device])


def world(size, local_rank):
    return types.SimpleNamespace(size=size, rank=local_rank, local_rank=local_rank)


# (--device, world size): the GPU of each local rank, on a machine with two
PLACEMENT = [('auto', 1, [0]), ('cuda', 1, [0]), ('cuda:1', 1, [1]),
             ('auto', 2, [0, 1]), ('cuda', 2, [0, 1]), ('cuda:1', 2, [1, 1])]


@needs_cuda_build
@pytest.mark.parametrize('device, size, gpus', PLACEMENT)
def test_each_process_gets_its_gpu_and_sets_it_up(device, size, gpus, image_folder, monkeypatch):
    infos = []
    for local_rank, gpu in enumerate(gpus):
        with cuda_stand_in(monkeypatch, count=2) as driver:
            process = setup_process(study_args(image_folder, device), world(size, local_rank))
            prepare_device(process.device, deterministic=False)  # torch.cuda.set_device's checks
            assert process.device == torch.device('cuda', gpu) and process.precision == 'fp16'
            assert driver.current == gpu and ('setDevice', gpu) in driver.calls
            assert torch.backends.cudnn.benchmark
            infos.append(process.info)
    for info in infos:
        assert info['device'] == 'cuda' and info['gpu'] == info['device_model'] == GPU_NAME
        assert info['cuda'] == torch.version.cuda
    environment = world_environment(infos)
    assert environment['gpus'] == {GPU_NAME: len(gpus)} and environment['world_size'] == len(gpus)
    assert environment['device'] == 'cuda' and environment['precision'] == 'fp16'


@needs_cuda_build
@pytest.mark.parametrize('device, size, local_rank, message', [
    ('cuda:2', 1, 0, "--device cuda:2: .* has 2 GPUs, cuda:0 to cuda:1"),
    ('cuda:7', 2, 1, "--device cuda:7: .* has 2 GPUs, cuda:0 to cuda:1"),
    ('cuda', 3, 2, r'2 GPUs on .*, fewer than the processes torchrun started there .*cuda:0'),
    ('auto', 3, 2, r'2 GPUs on .*, fewer than the processes torchrun started there'),
])
def test_a_gpu_past_the_last_is_refused_in_one_line(device, size, local_rank, message,
                                                     image_folder, monkeypatch):
    with cuda_stand_in(monkeypatch, count=2):
        with pytest.raises(StudyError, match=message):
            setup_process(study_args(image_folder, device), world(size, local_rank))


@needs_cuda_build
def test_without_a_gpu_cuda_is_refused(image_folder, monkeypatch):
    with cuda_stand_in(monkeypatch, count=0):
        with pytest.raises(StudyError, match='sees no CUDA device; use --device cpu or auto'):
            setup_process(study_args(image_folder, 'cuda'), world(1, 0))
        process = setup_process(study_args(image_folder, 'auto'), world(1, 0))
        assert process.device == torch.device('cpu')


class FailingRunner:
    """A runner on a GPU whose run meets a CUDA error, as an illegal memory access raises."""
    device = torch.device('cuda', 0)
    device_model = GPU_NAME
    launch = 'launch'
    world = types.SimpleNamespace(rank=0)

    def run(self, config, run):
        raise RuntimeError('CUDA error: an illegal memory access was encountered')


@needs_cuda_build
def test_a_run_that_fails_with_a_cuda_error_is_recorded(monkeypatch):
    with cuda_stand_in(monkeypatch, count=1) as driver:
        torch.cuda.init()
        driver.sticky_error = 'an illegal memory access was encountered'  # every call fails now
        record, outputs = train_one(FailingRunner(), 'baseline', 3)
        assert isinstance(record, FailedTry) and outputs is None
        assert (record.config, record.run, record.error_type) == ('baseline', 3, 'RuntimeError')
        assert 'illegal memory access' in record.error and record.device == 'cuda:0'
        # the process then stops taking runs: each would fail the same way
        assert 'illegal memory access' in device_failure(FailingRunner.device)
        driver.sticky_error = None
        assert device_failure(FailingRunner.device) is None  # an out-of-memory run: memory freed
        assert driver.calls[-1] == ('emptyCache',)


def hiverge_study(study_main, image_folder, study_dir, *flags):
    return study_main(['airbench94_hiverge', '--runs', '2', '--study-dir', str(study_dir),
                       '--save-logits', *flags, '--', *training(warmup=True),
                       '--data-dir', image_folder])


def test_saved_logits_are_the_methods_own(study_main, image_folder, tmp_path):
    """airbench94_hiverge gives TTA to the least confident quarter of the test images: its saved
    TTA logits are the plain ones on the other three quarters, exactly (not TTA on every image)."""
    study_dir = tmp_path / 'study'
    assert hiverge_study(study_main, image_folder, study_dir, '--val-split', '64') == 0
    for (config, run), record in records(study_dir).items():
        outputs = torch.load(study_dir / 'runs' / config / f'{run:05d}.pt')
        num_test = len(outputs['logits'])
        plain_rows = (outputs['logits'] == outputs['logits_plain']).all(1).sum().item()
        assert plain_rows == num_test - int(num_test * 0.25) and num_test == 128
        labels = torch.tensor(json.load(open(study_dir / 'test_labels.json')))
        accuracy = (outputs['logits'].argmax(1) == labels).float().mean().item()
        assert record['test_acc'] == accuracy and record['accuracy_on'] == 'validation'


def test_the_warmup_meets_every_forward_pass_of_the_runs_and_their_outputs(
        study_main, image_folder, tmp_path, monkeypatch):
    """On CUDA a forward pass the warmup did not meet compiles (and captures a CUDA graph) inside
    a timed run: the record lists such passes, and a study's runs and saved outputs have none."""
    study_dir = tmp_path / 'study'
    assert hiverge_study(study_main, image_folder, study_dir, '--val-split', '64') == 0
    for record in records(study_dir).values():
        assert record['forward_variants_not_warmed_up'] == []
    # The control: a warmup that skips the saved outputs' evaluation leaves its passes unmet
    runner_warm_up = studylib.runs.Runner.warm_up

    def warm_up_without_outputs(runner, configs):
        monkeypatch.setattr(runner, 'evaluates_test_set', lambda: False)
        runner_warm_up(runner, configs)
        monkeypatch.undo()
    monkeypatch.setattr(studylib.runs.Runner, 'warm_up', warm_up_without_outputs)
    control_dir = tmp_path / 'control'
    assert hiverge_study(study_main, image_folder, control_dir, '--val-split', '64') == 0
    for record in records(control_dir).values():
        unmet = record['forward_variants_not_warmed_up']
        # TTA on 32 of the 128 test images: 6 views of 8 images, and 2000 is bigger than 128
        assert unmet and all(': eval, no grad,' in variant for variant in unmet), unmet
        assert 'airbench94_hiverge network 1: eval, no grad, 192x3x32x32 float32' in ' '.join(unmet)


def test_configurations_that_differ_beyond_the_architecture_share_one_network(
        study_main, image_folder, tmp_path, monkeypatch):
    """A network (on CUDA: compiled, with its CUDA graphs' memory) per script and architecture:
    configurations that differ in TTA or the whitening's init use the same one."""
    built = []
    module = studylib.scripts.load_script(os.path.join(REPO, 'airbench94.py'))
    build_net = module.build_net

    def recording(arch, *args):
        built.append(arch['widths']['block1'])  # as build_net reads it: no other entry read
        return build_net(arch, *args)
    monkeypatch.setattr(module, 'build_net', recording)
    monkeypatch.setattr(studylib.scripts, 'load_script', lambda path: module)
    assert study_main(['airbench94', '--runs', '1', '--study-dir', str(tmp_path / 'study'),
                       '--config', 'base', '--config', 'tta1', 'net.tta_level=1',
                       '--config', 'eps', 'net.whiten_eps=0.001', '--config', 'narrow',
                       "net.widths={'block1': 8, 'block2': 8, 'block3': 8}",
                       '--', *training(warmup=True), '--data-dir', image_folder]) == 0
    assert built == [16, 8]
    assert len(records(tmp_path / 'study')) == 4
