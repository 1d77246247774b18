"""study.py on a GPU, checked without one: the engine's device path under a stand-in for the
CUDA driver that keeps torch's own rules (tests/cuda_stand_in.py), and what a GPU would compile:
the evaluations of the runs and their outputs, the warmup, the networks."""
import glob
import json
import logging
import os
import types

import pytest
import torch

from conftest import load_script
from cuda_stand_in import GPU_NAME, cuda_stand_in, needs_cuda_build
from test_study import (METHOD_API_ONLY, STAND_IN, STAND_IN_FLAGS, accuracy_of, argv,  # noqa
                        image_folder, outputs_of, records, study_main, training)

import studylib.runs  # noqa: E402
import studylib.scripts  # noqa: E402
from studylib import cli  # noqa: E402
from studylib.device import prepare_device  # noqa: E402
from studylib.device import world_environment  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.launch import device_failure, train_one  # noqa: E402
from studylib.plan import setup_process  # noqa: E402
from studylib.records import FailedTry  # noqa: E402
from studylib.runs import EntriesRead  # noqa: E402


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
        with pytest.raises(StudyError, match='sees no CUDA device; use --device cpu'):
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


def test_the_saved_logits_are_the_methods_own_and_the_warmup_meets_every_forward_pass(
        study_main, image_folder, tmp_path, monkeypatch):
    """airbench94_hiverge gives TTA to the least confident quarter of the test images: its saved
    TTA logits are the plain ones on the other three quarters, exactly (not TTA on every image).
    On CUDA a forward pass the warmup did not meet compiles (and captures a CUDA graph) inside a
    timed run: the record lists such passes, and a study's runs and saved outputs have none."""
    flags = ['--save-logits', '--val-split', '64']
    assert study_main(argv(tmp_path, image_folder, *flags, runs=2, script='airbench94_hiverge',
                           flags=training(warmup=True))) == 0
    labels = torch.tensor(json.load(open(tmp_path / 'test_labels.json')))
    found = records(tmp_path)
    for (config, run), record in found.items():
        outputs = outputs_of(tmp_path, config, run)
        plain_rows = (outputs['logits'] == outputs['logits_plain']).all(1).sum().item()
        assert len(outputs['logits']) == 128 and plain_rows == 128 - int(128 * 0.25)
        assert record['test_acc'] == accuracy_of(outputs['logits'], labels)
        assert record['accuracy_on'] == 'validation'
    # checked on the first run; the second meets the same passes
    assert [found[('baseline', run)].get('forward_variants_not_warmed_up') for run in (0, 1)] == [
        [], None]
    # The control: a warmup that skips the saved outputs' evaluation leaves its passes unmet (a
    # script of a linear network, quick to train: its infer's batches of 100 of the test set)
    runner_warm_up = studylib.runs.Runner.warm_up

    def warm_up_without_outputs(runner, configs):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runner, 'evaluates_test_set', lambda: False)
            runner_warm_up(runner, configs)
    monkeypatch.setattr(studylib.runs.Runner, 'warm_up', warm_up_without_outputs)
    assert study_main(argv(tmp_path / 'control', image_folder, *flags, script=METHOD_API_ONLY,
                           flags=[*STAND_IN_FLAGS[:-1], '--warmup'])) == 0
    unmet = records(tmp_path / 'control')[('baseline', 0)]['forward_variants_not_warmed_up']
    assert unmet == [f'{METHOD_API_ONLY} network 1: train, no grad, {images}x3x32x32 float32 '
                     'channels_last, 2 of 2 parameters trainable' for images in (100, 28)], unmet


WIDE_STAND_IN = """
BUILT = []


def build_net(arch, num_classes, device, precision):  # a network of arch['width']
    BUILT.append(arch['width'])
    return StandIn(num_classes)
"""


def test_configurations_that_differ_beyond_the_architecture_share_one_network(
        study_main, image_folder, tmp_path):
    """A network (on CUDA: compiled, with its CUDA graphs' memory) per script and architecture,
    the entries of hyp['net'] that build_net reads: configurations that differ in anything else
    (TTA, airbench94's whitening init) use the same one."""
    copy = tmp_path / 'wide.py'
    copy.write_text(open(STAND_IN).read().replace("'net': {'tta_level': 2}",
                                                  "'net': {'tta_level': 2, 'width': 16}") +
                    WIDE_STAND_IN)
    module = studylib.scripts.load_script(str(copy))
    assert study_main(argv(tmp_path / 'study', image_folder, '--config', 'base', '--config',
                           'tta1', 'net.tta_level=1', '--config', 'lower', 'curve.c=0.05',
                           '--config', 'narrow', 'net.width=8', script=str(copy),
                           flags=[*STAND_IN_FLAGS, '--warmup']), module) == 0
    assert module.BUILT == [16, 8] and len(records(tmp_path / 'study')) == 4
    airbench94 = load_script('airbench94')
    arch = EntriesRead(airbench94.hyp['net'])
    airbench94.build_net(arch, 10, torch.device('cpu'), 'fp32')
    assert arch.read and not arch.read & {'tta_level', 'whiten_eps'}, arch.read


def test_a_run_during_which_torch_compile_hit_its_limit_fails_and_the_process_stops(
        study_main, image_folder, tmp_path, monkeypatch):
    """Past its recompile limit torch.compile runs new variants eagerly and says so only in a
    warning: the run in which it says so is recorded as failed (not timed eagerly), and so would
    every later run of the process be, so the process stops."""
    module = studylib.scripts.load_script(STAND_IN)
    train = module.train

    def train_hitting_the_limit(data, hyp, device, precision, seeds, *args, **kwargs):
        if seeds == module.source_seeds(1):  # run 1, as dynamo words it (convert_frame.py)
            logging.getLogger('torch._dynamo.convert_frame').warning(
                'torch._dynamo hit config.%s (%s)\n   function: %s', 'recompile_limit', 8, 'inner')
        return train(data, hyp, device, precision, seeds, *args, **kwargs)
    monkeypatch.setattr(module, 'train', train_hitting_the_limit)
    assert study_main(argv(tmp_path, image_folder, runs=3), script=module) == 2
    assert sorted(records(tmp_path)) == [('baseline', 0)]
    failed = json.load(open(tmp_path / 'runs' / 'baseline' / '00001.failed.json'))
    (attempt,) = failed['failures']
    assert attempt['error_type'] == 'RecompileLimitHit'
    assert 'hit config.recompile_limit (8)' in attempt['error']
    assert not glob.glob(str(tmp_path / 'runs' / 'baseline' / '00002*'))


def compiling_as_on_cuda(monkeypatch, graphs):
    """Every script compiled as on CUDA (compiles(device) forced), by dynamo with a backend that
    records each graph (its inputs' shapes) and runs it eagerly; each graph is appended to graphs
    with the (script, block1 width) of the train() call that compiled it."""
    compile_function = torch.compile
    current = [None]

    def recording_backend(graph_module, example_inputs):
        graphs.append((current[0], tuple(tuple(t.shape) for t in example_inputs
                                         if isinstance(t, torch.Tensor))))
        return graph_module.forward
    monkeypatch.setattr(torch, 'compile', lambda model, mode=None, **kwargs:
                        compile_function(model, backend=recording_backend, **kwargs))
    load = studylib.scripts.load_script

    def load_compiling(path):
        module = load(path)
        module.compiles = lambda device: True
        train = module.train

        def train_noting(data, hyp, *args, **kwargs):
            current[0] = (os.path.basename(path)[:-3], hyp['net']['widths']['block1'])
            return train(data, hyp, *args, **kwargs)
        module.train = train_noting
        return module
    monkeypatch.setattr(studylib.scripts, 'load_script', load_compiling)


MIXED = [('hiverge', 'airbench94_hiverge'), ('muon', 'airbench94_muon'),
         ('compiled', 'airbench94_compiled'),
         ('hiverge16', 'airbench94_hiverge',
          "net.widths={'block1': 16, 'block2': 16, 'block3': 16}")]


@pytest.mark.slow
def test_each_configuration_of_a_mixed_study_compiles_what_its_script_compiles_alone(
        study_main, image_folder, tmp_path, monkeypatch):
    """Four compiled networks in one process: with torch.compile's limit of 8 variants shared by
    them all (nn.Sequential's forward), a study of these ran some of them eagerly. Here every
    configuration compiles, in its warmup, the same graphs as in a study of it alone (or has them
    from a configuration of its script), none in its runs, and no run is failed for a limit hit."""
    import torch._dynamo
    if hasattr(torch._dynamo.config, 'fail_on_cache_limit_hit'):  # torch 2.5 on; else the warning
        monkeypatch.setattr(torch._dynamo.config, 'fail_on_cache_limit_hit', True)
    graphs = []
    compiling_as_on_cuda(monkeypatch, graphs)
    flags = ['--', *training(width=8, warmup=True), '--data-dir', image_folder]
    torch._dynamo.reset()
    study_dir = tmp_path / 'mixed'
    assert study_main(['airbench94_hiverge', '--runs', '1', '--study-dir', str(study_dir),
                       *[word for config in MIXED for word in ('--config', *config)],
                       *flags]) == 0
    found = records(study_dir)
    assert sorted(config for config, _ in found) == sorted(config[0] for config in MIXED)
    assert all(record['graphs_compiled_during_run'] == 0 for record in found.values())
    mixed = sorted(graphs)
    alone = []
    for config in MIXED:
        torch._dynamo.reset()
        graphs.clear()
        assert study_main([config[1], '--runs', '1', '--study-dir', str(tmp_path / config[0]),
                           '--config', *config, *flags]) == 0
        alone += graphs
    # A graph of the same script and inputs compiled by another configuration (hiverge16's
    # augmentation, width-free, is hiverge's on torch 2.4, which reuses it) serves both
    assert {(script, shapes) for (script, _), shapes in mixed} == {
        (script, shapes) for (script, _), shapes in alone}
    assert len(set(script for script, _ in mixed)) == 4
