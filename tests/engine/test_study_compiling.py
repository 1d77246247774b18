"""Compiling a study's configurations once per machine, before the runs (studylib.compiling): the
compiling processes stood in for; slow, the real thing under torchrun."""
import glob
import io
import json
import os
import pickle
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

import test_study
from conftest import free_port
from test_study import (STAND_IN, STAND_IN_FLAGS, argv, finish, image_folder,  # noqa: F401
                        launch, records, study_main, training)

import studylib.compiling as compiling  # noqa: E402
import studylib.scripts  # noqa: E402
from studylib import analysis, markdown  # noqa: E402
from studylib.device import compiles_network  # noqa: E402
from studylib.distribute import ResilientStore, World  # noqa: E402
from studylib.records import CompileRecord  # noqa: E402

WARMUP = [*STAND_IN_FLAGS, '--warmup']
RESULT = dict(graphs=5, compiled=6, from_cache=0)  # what a compiling process says, made up


@pytest.fixture
def compiled_stand_in(tmp_path):
    """The stand-in, its forward wrapped by torch.compile as a compiled script's (never called)."""
    path = tmp_path / 'compiled_stand_in.py'
    path.write_text(open(STAND_IN).read() + '''

def build_net(arch, num_classes, device, precision):
    net = StandIn(num_classes)
    net.forward = torch.compile(net.forward, backend='eager')
    return net
''')
    return str(path)


@pytest.fixture
def compile_processes(monkeypatch):
    """Each job appended to the list returned; after 0.2 s RESULT, or an error for 'broken*'."""
    jobs = []

    def run(job, compile_threads):
        jobs.append((job, compile_threads))
        time.sleep(0.2)
        if job.config.startswith('broken'):
            return 0.2, dict(error='RuntimeError: inductor failed')
        return 0.2, dict(RESULT)
    monkeypatch.setattr(compiling, 'run_compile_process', run)
    return jobs


def compile_records(study_dir):
    (path,) = glob.glob(os.path.join(study_dir, 'compiles', '*.json'))
    return [CompileRecord.from_json(entry) for entry in json.load(open(path))]


def test_a_network_that_torch_compile_wraps_is_told_apart():
    plain = torch.nn.Linear(2, 2)
    assert not compiles_network(plain)
    wrapped = torch.nn.Linear(2, 2)
    wrapped.forward = torch.compile(wrapped.forward, backend='eager')
    assert compiles_network(wrapped)
    assert compiles_network(torch.compile(torch.nn.Linear(2, 2), backend='eager'))


def test_each_compiled_configuration_compiles_once_before_the_runs(
        study_main, compiled_stand_in, compile_processes, image_folder, tmp_path, capsys):
    """Four configurations, two of one (script, hyp) but for the epochs: three compiling
    processes, two at once, told the warmup's shapes; then each warmup (a failed compile's too);
    the costs in compiles/ and report.md."""
    study_dir = tmp_path / 'study'
    assert study_main(argv(study_dir, image_folder, '--config', 'a', '--config', 'b',
                           'aug.flip=random', '--config', 'c', 'opt.train_epochs=5', '--config',
                           'broken', 'aug.flip=none', '--compile-jobs', '2', '--save-logits',
                           script=compiled_stand_in, flags=WARMUP)) == 0
    jobs = sorted(compile_processes, key=lambda entry: entry[0].config)
    assert [job.config for job, _ in jobs] == ['a', 'b', 'broken']
    assert {threads for _, threads in jobs} == {max(1, compiling.usable_cores() // 2)}
    job = jobs[0][0]
    assert (job.script, job.device, job.precision, job.num_classes) == (
        compiled_stand_in, 'cpu', 'fp32', 4)
    assert (job.num_eval, job.num_test, job.save_plain) == (128, 128, True)
    assert job.hyp['aug']['flip'] == 'alternating' and jobs[1][0].hyp['aug']['flip'] == 'random'
    found = compile_records(study_dir)
    before = [r for r in found if r.stage == compiling.STAGE]
    assert [(r.config, r.graphs, r.compiled, r.from_cache, r.came_from()) for r in before] == [
        ('a', 5, 6, 0, 'compiled'), ('b', 5, 6, 0, 'compiled'), ('broken', 0, 0, 0, 'failed')]
    assert before[2].error == 'RuntimeError: inductor failed'
    warmups = [r for r in found if r.stage == 'warmup']
    assert sorted(r.config for r in warmups) == ['a', 'b', 'broken']  # c: a's (script, hyp)
    assert all(r.came_from() == 'eager' and r.seconds > 0 for r in warmups)
    output = capsys.readouterr().out
    assert 'compiling 3 configurations on' in output and ', 2 at once: a, b, broken' in output
    assert output.count('compiled a before the runs in') == 1
    assert ('compiling broken before the runs failed after 0.2 s (RuntimeError: inductor '
            'failed); its warmups compile it') in output
    report = open(study_dir / 'report.md').read()
    assert '| a | before the runs | 1 | 0.2, 0.2 | 5 | 6, 0 | 1 compiled |' in report
    assert len(records(study_dir)) == 4


TWO = ['--config', 'a', '--config', 'b', 'aug.flip=random']


@pytest.mark.parametrize('cores, jobs', [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4)])
def test_compiles_at_once_by_default_one_per_four_cores(monkeypatch, cores, jobs):
    monkeypatch.setattr(compiling, 'usable_cores', lambda: cores)
    assert compiling.default_compile_jobs() == jobs


@pytest.mark.parametrize('study_flags, configs, warmup', [
    (['--compile-jobs', '0'], TWO, True),  # turned off: each warmup compiles
    (['--compile-jobs', '1'], TWO, True),  # one at a time in one process: as its warmups do
    ([], ['--config', 'a'], True),  # one configuration, one process: its warmup compiles it
    ([], TWO, False)])  # no warmup, nothing compiled before the runs
def test_no_compiling_process_where_it_saves_nothing_or_is_turned_off(
        study_main, compiled_stand_in, compile_processes, image_folder, tmp_path, study_flags,
        configs, warmup):
    assert study_main(argv(tmp_path, image_folder, *configs, *study_flags,
                           script=compiled_stand_in,
                           flags=WARMUP if warmup else STAND_IN_FLAGS)) == 0
    assert compile_processes == []
    stages = {record.stage for record in compile_records(tmp_path)} if warmup else set()
    assert stages == ({'warmup'} if warmup else set())


def machine(local_rank, store, monkeypatch, jobs_at_once=2):
    """The Compiler of local_rank of 2 on one machine: each configuration compiles, no caches."""
    for key, value in (('LOCAL_WORLD_SIZE', 2), ('GROUP_RANK', 0), ('RANK', local_rank),
                       ('LOCAL_RANK', local_rank), ('WORLD_SIZE', 2)):
        monkeypatch.setenv(key, str(value))
    world = World.of_environment(store)
    world.join()
    runner = types.SimpleNamespace(launch='L', request=types.SimpleNamespace(lost_after=0.3),
                                   device=torch.device('cpu'), device_model='a CPU')
    compiler = compiling.Compiler(runner, world, jobs_at_once=jobs_at_once)
    monkeypatch.setattr(compiler, 'compiled_configs', lambda configs: configs)
    monkeypatch.setattr(compiling, 'enable_compile_caches', lambda: None)
    return compiler


def test_the_machines_processes_wait_for_each_others_share_or_go_on_if_one_is_lost(monkeypatch,
                                                                                   capsys):
    store = ResilientStore(connect=dist.HashStore)
    machine(0, store, monkeypatch)
    compiler = machine(1, store, monkeypatch)
    threading.Timer(0.2, lambda: store.set(compiler.done_key(0), '1')).start()
    start = time.perf_counter()
    compiler.wait_for(0)
    assert 0.2 <= time.perf_counter() - start < 5  # it waited for the first, then went on
    assert capsys.readouterr().out == ''
    store.delete(compiler.done_key(0))
    start = time.perf_counter()  # the first process's heartbeat never moves: lost after 0.3 s
    compiler.wait_for(0)
    assert 0.3 <= time.perf_counter() - start < 10
    assert 'rank 0 of' in capsys.readouterr().out


@pytest.mark.parametrize('local_rank, share', [(0, ['a', 'c']), (1, ['b'])])
def test_the_machines_processes_share_its_configurations(monkeypatch, local_rank, share):
    """Each compiles every P-th configuration with its part of --compile-jobs and of the cores,
    then waits for every process that has a share, and no other."""
    store = ResilientStore(connect=dist.HashStore)
    compiler = machine(local_rank, store, monkeypatch)
    monkeypatch.setattr(compiling, 'usable_cores', lambda: 8)
    jobs = []
    waited = []
    monkeypatch.setattr(compiler, 'job', lambda config: types.SimpleNamespace(config=config))
    monkeypatch.setattr(compiling, 'run_compile_process',
                        lambda job, threads: jobs.append((job.config, threads)) or (0.1, {}))
    monkeypatch.setattr(compiler, 'wait_for', waited.append)
    records = compiler.compile(['a', 'b', 'c'])
    assert sorted(jobs) == [(config, 4) for config in share]  # 1 at once, 8 cores / 2 processes
    assert [record.config for record in records] == share
    assert store.check(compiler.done_key(local_rank)) and waited == [0, 1]
    jobs.clear()
    waited.clear()
    compiler.runner.launch = 'L2'  # another launch, of one configuration
    one = compiler.compile(['a'])  # the second process has no share: it waits for the first's
    assert (len(one), len(jobs), waited) == ((1, 1, [0]) if local_rank == 0 else (0, 0, [0]))


def test_below_two_compiles_at_once_the_machines_processes_compile_in_their_warmups(
        monkeypatch):
    """Under torchrun too: slower than the warmups on 2 cores (docs/cpu.md)."""
    store = ResilientStore(connect=dist.HashStore)
    compiler = machine(0, store, monkeypatch, jobs_at_once=1)
    started = []
    monkeypatch.setattr(compiler, 'compile_all', started.append)
    monkeypatch.setattr(compiler, 'wait_for', started.append)
    assert compiler.compile(['a', 'b', 'c']) == [] and started == []
    assert not store.check(compiler.done_key(0))


def test_a_compiling_process_warms_the_configuration_up_and_says_what_it_cost(
        monkeypatch, capsys, compiled_stand_in):
    """The job pickled on stdin (its hyp's tuples kept), one JSON line out, an error said."""
    hyp = {**studylib.scripts.load_script(compiled_stand_in).hyp, 'net': {'tta_level': 2}}
    job = compiling.CompileJob(config='a', script=compiled_stand_in, hyp=hyp, device='cpu',
                               precision='fp32', deterministic=False, num_classes=4, num_eval=64,
                               num_test=64, save_plain=True, mean=(0.5,) * 3, std=(0.25,) * 3)
    for stdin, says in [(job, {'seconds', 'graphs', 'compiled', 'from_cache'}),
                        (compiling.CompileJob(**{**job.__dict__, 'script': '/nowhere.py'}),
                         {'error'})]:
        monkeypatch.setattr('sys.stdin', io.TextIOWrapper(io.BytesIO(pickle.dumps(stdin))))
        compiling.main()
        result = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert set(result) == says
    assert '/nowhere.py: no such file' in result['error']


def test_what_compiling_cost_is_summed_per_configuration_and_stage():
    def record(config, stage, rank, seconds, compiled, from_cache, error=None):
        return CompileRecord(config=config, launch='L', stage=stage, rank=rank, host='h',
                             device='cuda:0', device_model='H100', seconds=seconds, graphs=6,
                             compiled=compiled, from_cache=from_cache, error=error)
    costs = analysis.compile_costs([
        record('a', compiling.STAGE, 0, 200.0, 12, 0), record('a', 'warmup', 0, 3.0, 0, 12),
        record('a', 'warmup', 1, 5.0, 0, 12), record('b', compiling.STAGE, 0, 9.0, 0, 0, 'boom')])
    assert costs == [
        dict(config='a', stage=compiling.STAGE, processes=1, seconds_mean=200.0,
             seconds_max=200.0, graphs=6, compiled=12, from_cache=0, came_from={'compiled': 1}),
        dict(config='a', stage='warmup', processes=2, seconds_mean=4.0, seconds_max=5.0,
             graphs=6, compiled=0, from_cache=24, came_from={'cache': 2}),
        dict(config='b', stage=compiling.STAGE, processes=1, seconds_mean=9.0, seconds_max=9.0,
             graphs=6, compiled=0, from_cache=0, came_from={'failed': 1})]
    lines = markdown.compile_lines(costs)
    assert '  | a | warmup | 2 | 4.0, 5.0 | 6 | 0, 24 | 2 cache |' in lines
    assert markdown.compile_lines([]) == []


@pytest.mark.slow
def test_under_torchrun_each_graph_compiles_once_on_the_machine(image_folder, tmp_path,
                                                                 monkeypatch):
    """Two processes, two configurations of airbench94_compiled, an empty inductor cache: each
    process compiles one before the runs; every warmup of both then loads every graph from the
    cache (inductor's counters), and no run compiles."""
    study_dir = tmp_path / 'study'
    monkeypatch.setitem(test_study.ENV, 'TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'inductor'))
    widths = "net.widths={'block1': 8, 'block2': 8, 'block3': %d}"
    result = finish(launch(
        'airbench94_compiled', '--runs', '1', '--study-dir', str(study_dir), '--compile-jobs', '2',
        '--config', 'w8', widths % 8, '--config', 'w16', widths % 16, '--',
        *training(epochs=None), '--epochs', '0.5', '--warmup',
        '--data-dir', image_folder,
        launcher=['--nproc_per_node=2', f'--master-port={free_port()}']), timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    found = compile_records(study_dir)
    before = {r.config: r for r in found if r.stage == compiling.STAGE}
    assert sorted(before) == ['w16', 'w8'] and sorted(r.rank for r in before.values()) == [0, 1]
    assert all(r.compiled > 0 and r.came_from() == 'compiled' for r in before.values())
    warmups = [r for r in found if r.stage == 'warmup']
    assert sorted((r.config, r.rank) for r in warmups) == [
        ('w16', 0), ('w16', 1), ('w8', 0), ('w8', 1)]
    assert all(r.compiled == 0 and r.from_cache > 0 and r.came_from() == 'cache'
               for r in warmups)  # each graph compiled once on the machine
    assert sum(r.compiled for r in found) == sum(r.compiled for r in before.values())
    assert all(record['graphs_compiled_during_run'] == 0
               for record in records(study_dir).values())
