"""study.py on a GPU, checked without one (issue 41): the engine's whole device path under a stand-in
for the CUDA driver that keeps torch's own rules (tests/cuda_stand_in.py): --device auto, cuda and
cuda:N at world sizes 1 and 2, setup_process, prepare_device and the environment record; a GPU past
the last refused in one line; a run that fails with a CUDA error still recorded."""
import types

import pytest
import torch

from conftest import load_script
from cuda_stand_in import GPU_NAME, cuda_stand_in, needs_cuda_build

load_script('study')  # puts the repository on the path
from studylib import cli  # noqa: E402
from studylib.device import prepare_device  # noqa: E402
from studylib.environment import world_environment  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.launch import device_failure, train_one  # noqa: E402
from studylib.records import FailedTry  # noqa: E402
from studylib.setup import setup_process  # noqa: E402

pytestmark = needs_cuda_build


def study_args(image_folder, device):
    return cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'unused', '--',
                           '--dataset', 'folder', '--data-dir', image_folder, '--device', device])


def world(size, local_rank):
    return types.SimpleNamespace(size=size, rank=local_rank, local_rank=local_rank)


# (--device, world size): the GPU of each local rank, on a machine with two
PLACEMENT = [('auto', 1, [0]), ('cuda', 1, [0]), ('cuda:1', 1, [1]),
             ('auto', 2, [0, 1]), ('cuda', 2, [0, 1]), ('cuda:1', 2, [1, 1])]


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
