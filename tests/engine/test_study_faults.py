"""study.py when processes, machines, runs and the store fail: every run once, nothing finished
lost, no timeout waited out where the failure is known."""
import dataclasses
import datetime
import json
import os
import signal
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist

import test_study
from conftest import free_port, torchrun_worker
from test_study import (STAND_IN, argv, finish, image_folder, launch,  # noqa: F401
                        record_files, records, study_main, study_summary, trained, training,
                        two_node_launch, wait_for)

from studylib import distribute  # noqa: E402
from studylib.collect import Collector  # noqa: E402
from studylib.plan import Plan  # noqa: E402
from studylib.records import CompileRecord, Message, RunRecord  # noqa: E402

RUNS = ['--runs', '8', '--', *training(width=32, epochs=2)]


def launchers_for(topology, study_dir, data_dir, restarts, *flags):
    """study.py alone, or torchrun: one node of two processes, or two nodes of one on localhost."""
    args = ['airbench94', '--study-dir', str(study_dir), *flags, *RUNS, '--data-dir', data_dir]
    if topology == 'alone':
        return [launch(*args)]
    port = free_port()
    if topology == 'one node':
        return [launch(*args, launcher=['--nproc_per_node=2', f'--max-restarts={restarts}',
                                        f'--master-port={port}'])]
    launchers = []
    for node in (0, 1):
        launchers.append(two_node_launch(node, port, study_dir, data_dir, *flags, *RUNS,
                                         rendezvous=topology.split()[-1], restarts=restarts))
        time.sleep(0.5)  # node 0's agent first: it serves the store
    return launchers


def worker(launchers, rank):
    return next(filter(None, (torchrun_worker(launcher.pid, rank) for launcher in launchers)))


@pytest.mark.slow
@pytest.mark.parametrize('topology, rank, restarts', [
    ('one node', 1, 0), ('one node', 0, 0), ('alone', 'SIGTERM', 0),
    *[(topology, rank, 2) for topology in ('one node', 'two nodes, static', 'two nodes, c10d')
      for rank in (1, 0)]])
def test_a_killed_process_loses_no_finished_run_and_its_runs_are_trained_once(
        topology, rank, restarts, image_folder, tmp_path):
    """kill -9 of a worker (no chance to clean up), or SIGTERM of study.py alone (scancel, a
    preemption): without restarts the same command trains only what is left; with torchrun
    --max-restarts the same launch completes, its replacement taking the run over at once."""
    study_dir = tmp_path / 'study'
    start = time.monotonic()
    launchers = launchers_for(topology, study_dir, image_folder, restarts)
    wait_for(lambda: len(records(study_dir)) >= 2)
    if rank == 'SIGTERM':
        launchers[0].send_signal(signal.SIGTERM)
    else:
        os.kill(worker(launchers, rank), signal.SIGKILL)
    results = [finish(launcher, timeout=300) for launcher in launchers]
    finished = []
    before = {}
    if not restarts:
        first = results[0]
        before = record_files(study_dir)
        finished = sorted(records(study_dir))
        assert 2 <= len(finished) < 8, 'the study must be stopped part-way for this test'
        assert len(set(trained(first.stdout))) == len(trained(first.stdout))
        assert first.returncode != 0 and (rank != 'SIGTERM' or first.returncode == 143)
        if rank != 0:  # rank 0 lives on to write a partial summary and say so
            assert (f'Stopped: {len(finished)} of 8 finished runs are in {study_dir}; the same '
                    'command continues the study.') in first.stderr
            assert study_summary(study_dir)['status'] == 'partial'
        results = [finish(launcher) for launcher in
                   launchers_for(topology, study_dir, image_folder, restarts)]
    assert [result.returncode for result in results] == [0] * len(results), \
        results[0].stderr[-3000:]
    every_run = [('baseline', run) for run in range(8)]
    assert sorted(records(study_dir)) == every_run
    lines = [line for result in results for line in trained(result.stdout)]
    assert sorted(lines) == sorted(set(every_run) - set(finished))  # each written once
    after = record_files(study_dir)
    assert {path: after[path] for path in before} == before  # finished runs byte for byte
    assert study_summary(study_dir)['status'] == 'complete'
    if restarts and (rank == 0 or topology == 'two nodes, c10d'):  # c10d restarts every node's
        assert 'rank 0 rejoins the launch' in ''.join(result.stdout for result in results)
    # the replacement took the killed process's run at once: --lost-after (300 s) never waited
    assert not restarts or time.monotonic() - start < 150


@pytest.mark.slow
def test_a_stopped_process_has_its_run_taken_over_and_its_late_record_dropped(image_folder,
                                                                              tmp_path):
    study_dir = tmp_path / 'study'
    (first,) = launchers_for('one node', study_dir, image_folder, 0, '--lost-after', '3')
    wait_for(lambda: any(r['rank'] == 1 for r in records(study_dir).values()))
    stopped = worker([first], 1)
    os.kill(stopped, signal.SIGSTOP)  # alive but silent: a partitioned or frozen machine
    before_stop = {key for key, r in records(study_dir).items() if r['rank'] == 1}
    try:
        wait_for(lambda: os.path.exists(study_dir / 'summary.json') and
                 study_summary(study_dir)['status'] == 'complete', timeout=180)
        written = record_files(study_dir)
    finally:
        os.kill(stopped, signal.SIGCONT)
    result = finish(first)
    assert result.returncode == 0, result.stderr[-3000:]
    every_run = [('baseline', run) for run in range(8)]
    assert sorted(records(study_dir)) == every_run
    assert sorted(trained(result.stdout)) == every_run  # once each: the late record was dropped
    assert record_files(study_dir) == written  # nothing written after rank 1 woke up
    # the study was complete while rank 1 was stopped, so its run was taken over
    assert any(r['rank'] == 0 for key, r in records(study_dir).items() if key not in before_stop)


def test_the_holder_of_a_lease_alone_is_written(tmp_path):
    """In one process: B takes A's run over once A is dead; A's late record is never written."""
    shared = dist.HashStore()
    store = distribute.ResilientStore(connect=lambda: shared)
    a = distribute.World.of_environment(store)
    b = dataclasses.replace(distribute.World.of_environment(store), token='b-token')
    plan = Plan(launch='x', jobs=(('c', 0),), total=1, finished=0, environment={}, notes=(),
                data='')
    queue_a = distribute.Queue(a, 1, lost_after=60)
    queue_b = distribute.Queue(b, 1, lost_after=60)
    assert queue_a.claim() == (0, 1)
    assert queue_b.claim() is None  # A is alive: nothing to take
    store.set(f'dead/{a.token}', '1')  # as A's successor says when torchrun replaces it
    assert queue_b.claim() == (0, 2)  # B takes the run over: its second attempt
    record = RunRecord(config='c', run=0, script='s', seed=0, seeds={}, vary='all', accuracy=0.5,
                       accuracy_on='test', test_acc=0.5, val_acc=None, total_time_seconds=1.0,
                       steps=1, graphs_compiled_during_run=0, epoch_train_losses=[1.0],
                       diverged=False, train_images=1, rank=0, host='h', device='cpu',
                       device_model='m', torch='t', launch='x', finished='now')
    assert not queue_a.holds(0)
    late = dataclasses.replace(record, accuracy=0.1)
    store.set(f'record/0/{a.token}', Message(late, has_outputs=False).encode())  # a late record
    collector = Collector(a, plan, str(tmp_path))
    assert collector.collect() == 0  # not the holder's: not written
    store.set(f'record/0/{b.token}', Message(record, has_outputs=False).encode())
    assert collector.collect() == 1 and collector.collect() == 0
    written = json.load(open(tmp_path / 'runs' / 'c' / '00000.json'))
    assert written['accuracy'] == 0.5 and collector.all_done()


@pytest.mark.parametrize('rank_1', ['publishes', 'is lost'])
def test_rank_0_ends_a_launch_once_every_live_process_has_said_what_it_compiled(rank_1, tmp_path,
                                                                              monkeypatch):
    """Every run done while rank 1 still warms up: rank 0 waits for its CompileRecords, which
    compiles/LAUNCH.json then holds, and not for a lost process's."""
    monkeypatch.setenv('WORLD_SIZE', '2')
    shared = dist.HashStore()
    store = distribute.ResilientStore(connect=lambda: shared)
    zero = distribute.World.of_environment(store)
    one = dataclasses.replace(zero, rank=1, token='one')
    zero.join()
    one.join()
    plan = Plan(launch='x', jobs=(), total=0, finished=0, environment={}, notes=(), data='')
    collector = Collector(zero, plan, str(tmp_path))
    liveness = distribute.Liveness(store, lost_after=60)
    zero.publish('compiles/0', [])
    assert collector.all_done() and collector.awaits_compiles(liveness)
    if rank_1 == 'publishes':
        warmup = CompileRecord(config='c', launch='x', stage='warmup', rank=1, host='h',
                               device='cpu', device_model='m', seconds=2.0, graphs=4, compiled=0,
                               from_cache=4)
        one.publish('compiles/1', [warmup.to_json()])
    else:
        store.set('dead/one', '1')  # as its successor, or a silent heartbeat, says
    assert not collector.awaits_compiles(liveness)
    written = json.load(open(tmp_path / 'compiles' / 'x.json'))
    assert [record['rank'] for record in written] == ([1] if rank_1 == 'publishes' else [])


FAILING_STAND_IN = """
import os
_train = train
def train(data, hyp, *args, **kwargs):
    if hyp['curve']['b'] == 0.3 and os.path.exists(os.environ['AIRBENCH_TEST_FAIL']):
        raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB (simulated)')
    return _train(data, hyp, *args, **kwargs)
"""


@pytest.fixture
def failing_stand_in(tmp_path, monkeypatch):
    """The stand-in whose runs of curve.b=0.3 raise while the file flag (returned) exists."""
    script = tmp_path / 'failing_stand_in.py'
    script.write_text(open(STAND_IN).read() + FAILING_STAND_IN)
    flag = tmp_path / 'fail'
    flag.write_text('')
    monkeypatch.setenv('AIRBENCH_TEST_FAIL', str(flag))
    monkeypatch.setitem(test_study.ENV, 'AIRBENCH_TEST_FAIL', str(flag))
    return str(script), flag


def test_a_run_that_raises_is_recorded_and_the_next_launch_retries_it(
        failing_stand_in, study_main, image_folder, tmp_path, capsys):
    script, flag = failing_stand_in
    command = argv(tmp_path / 'study', image_folder, '--config', 'ok', '--config', 'bad',
                   'curve.b=0.3', runs=2, script=script)
    study_dir = tmp_path / 'study'
    for launch_number in (1, 2):
        assert study_main(command) == 2  # runs failed: retry
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith('error: 2 runs failed: bad run 0 (RuntimeError), bad run 1 '
                                '(RuntimeError)') and 'the same command retries them' in error
        assert sorted(records(study_dir)) == [('ok', 0), ('ok', 1)]
        tries = json.load(open(study_dir / 'runs' / 'bad' / '00000.failed.json'))['failures']
        assert len(tries) == launch_number  # one try per launch: a launch always ends
        assert tries[-1]['error_type'] == 'RuntimeError' and 'out of memory' in tries[-1]['error']
        assert tries[-1]['host'] == socket.gethostname() and tries[-1]['device'] == 'cpu'
        summary = study_summary(study_dir)
        assert summary['configs']['bad']['failed'] == 2 and summary['configs']['bad']['n'] == 0
        assert summary['configs']['ok']['n'] == 2 and summary['runs_failed'] == 2
        assert '- bad: 2 failed (RuntimeError: CUDA out of memory' in \
            open(study_dir / 'report.md').read()
    flag.unlink()  # the cause is gone: the same command retries and finishes the study
    assert study_main(command) == 0
    found = records(study_dir)
    assert sorted(found) == [('bad', 0), ('bad', 1), ('ok', 0), ('ok', 1)]
    assert found[('bad', 0)]['earlier_failures'] == 2
    assert not list((study_dir / 'runs' / 'bad').glob('*.failed.json'))
    assert study_summary(study_dir)['configs']['bad']['failed'] == 0


@pytest.mark.slow
def test_runs_that_fail_under_torchrun_restarts_end_the_launch(failing_stand_in, image_folder,
                                                               tmp_path):
    """Rank 0 exits 2 (runs failed); the launch torchrun restarts finds every run done (the failed
    ones by their tries), says so and ends."""
    study_dir = tmp_path / 'study'
    result = finish(launch(
        *argv(study_dir, image_folder, '--config', 'ok', '--config', 'bad', 'curve.b=0.3',
              runs=2, script=failing_stand_in[0]),
        launcher=['--nproc_per_node=2', '--max-restarts=1', f'--master-port={free_port()}']),
        timeout=240)
    assert result.returncode == 1  # torchrun's, for any status but 0
    assert result.stderr.count('failed (exitcode: 2) local_rank: 0') == 2  # the first, the restart
    assert "rank 0 rejoins the launch; study in" in result.stdout
    assert "2 of 4 runs of this launch's configurations finished, 0 to train" in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: rank 0: ')]
    assert errors == [errors[0]] * 2 and errors[0].startswith(
        'error: rank 0: 2 runs failed: bad run 0 (RuntimeError), bad run 1 (RuntimeError)')
    assert sorted(records(study_dir)) == [('ok', 0), ('ok', 1)]
    assert study_summary(study_dir)['configs']['bad']['failed'] == 2


def test_the_heartbeat_stops_however_its_block_is_left():
    """On an error too: one left inside a store call aborts the interpreter at its exit."""
    world = distribute.World.of_environment(distribute.ResilientStore(connect=dist.HashStore))
    with pytest.raises(KeyError):
        with distribute.Heartbeat(world) as heartbeat:
            assert heartbeat.is_alive()
            raise KeyError('a refusal after the heartbeat started')
    assert not heartbeat.is_alive()


class FlakyStore:
    """A store that fails every few calls, as a dropped connection does."""

    def __init__(self, store, every):
        self.store = store
        self.every = every
        self.calls = 0

    def __getattr__(self, name):
        def call(*args):
            self.calls += 1
            if self.calls % self.every == 0:
                raise dist.DistNetworkError('Connection reset by peer (simulated)')
            return getattr(self.store, name)(*args)
        return call


def test_a_store_that_drops_connections_does_not_end_a_study(study_main, image_folder, tmp_path,
                                                             monkeypatch):
    shared = dist.HashStore()
    monkeypatch.setattr(distribute, 'connect_store', lambda: FlakyStore(shared, every=5))
    assert study_main(argv(tmp_path, image_folder, '--config', 'a', '--config', 'b',
                           'curve.c=0.05', runs=3)) == 0
    assert len(records(tmp_path)) == 6


def test_a_dropped_tcp_connection_is_made_again_and_outputs_of_any_size_arrive_intact():
    """Through a proxy that cuts every connection once: the client reconnects, the state stays;
    20 MiB of outputs, which the TCPStore refuses above 8 MiB, travel in chunks."""
    server = dist.TCPStore('127.0.0.1', 0, 1, is_master=True, wait_for_workers=False)
    listener = socket.create_server(('127.0.0.1', 0))
    connections = []

    def pump(source, target):
        try:
            data = source.recv(65536)
            while data:
                target.sendall(data)
                data = source.recv(65536)
        except OSError:
            pass

    def accept():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(('127.0.0.1', server.port))
            connections.extend([client, upstream])
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(source, target), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    store = distribute.ResilientStore(connect=lambda: dist.TCPStore(
        '127.0.0.1', port, 1, is_master=False, timeout=datetime.timedelta(seconds=5)), patience=30)
    payload = torch.randint(0, 256, (20 << 20,), dtype=torch.uint8).numpy().tobytes()
    store.set_large('outputs/0/token', payload)
    assert store.add('counter', 2) == 2
    for connection in list(connections):  # the network drops every connection
        connection.shutdown(socket.SHUT_RDWR)
        connection.close()
    assert store.add('counter', 1) == 3 and store.get_large('outputs/0/token') == payload
    store.delete_large('outputs/0/token')
    assert not store.check('outputs/0/token/count')
    listener.close()
