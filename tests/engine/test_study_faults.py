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
from conftest import descendants, free_port
from test_study import (STAND_IN, argv, finish, image_folder, launch,  # noqa: F401
                        record_files, records, study_main, study_summary, trained, training,
                        wait_for)

from studylib import distribute  # noqa: E402
from studylib.collect import Collector  # noqa: E402
from studylib.plan import Plan  # noqa: E402
from studylib.records import Message, RunRecord  # noqa: E402

RUNS = ['--runs', '8', '--', *training(width=32, epochs=2)]


def worker(launchers, rank):
    """The pid of the live worker process of this rank under any of the launchers."""
    for launcher in launchers:
        for pid in descendants(launcher.pid):
            try:
                with open(f'/proc/{pid}/environ', 'rb') as f:
                    environment = dict(item.partition(b'=')[::2] for item in f.read().split(b'\0'))
                with open(f'/proc/{pid}/cmdline', 'rb') as f:
                    command = f.read()
                is_study = b'study.py' in command and b'torch.distributed.run' not in command
            except OSError:
                continue
            if environment.get(b'RANK') == str(rank).encode() and is_study:
                return pid
    return None


def launchers_for(topology, study_dir, data_dir):
    """torchrun with 2 restarts: one node with two processes, or two nodes of one on localhost."""
    port = free_port()
    restarts = '--max-restarts=2'
    if topology == 'one node':
        return [launch('airbench94', '--study-dir', str(study_dir), *RUNS, '--data-dir', data_dir,
                       launcher=['--nproc_per_node=2', restarts, f'--master-port={port}'])]
    rendezvous = {'two nodes, static': lambda node: [f'--node-rank={node}'],
                  'two nodes, c10d': lambda node: ['--rdzv-backend=c10d', '--rdzv-id=test']}
    launchers = []
    for node in (0, 1):
        launchers.append(launch('airbench94', '--study-dir', str(study_dir), *RUNS, '--data-dir',
                                data_dir, launcher=['--nnodes=2', '--nproc_per_node=1', restarts,
                                                    f'--rdzv-endpoint=127.0.0.1:{port}',
                                                    *rendezvous[topology](node)]))
        time.sleep(0.5)  # node 0's agent first: it serves the store
    return launchers


@pytest.mark.slow
@pytest.mark.parametrize('topology, rank', [('one node', 1), ('one node', 0),
                                            ('two nodes, static', 1), ('two nodes, static', 0),
                                            ('two nodes, c10d', 1), ('two nodes, c10d', 0)])
def test_a_killed_process_is_replaced_and_the_same_launch_completes(topology, rank, image_folder,
                                                                   tmp_path):
    study_dir = tmp_path / 'study'
    start = time.monotonic()
    launchers = launchers_for(topology, study_dir, image_folder)
    wait_for(lambda: len(records(study_dir)) >= 2)
    victim = worker(launchers, rank)
    os.kill(victim, signal.SIGKILL)  # mid-study, no chance to clean up
    results = [finish(launcher, timeout=300) for launcher in launchers]
    elapsed = time.monotonic() - start
    assert [result.returncode for result in results] == [0] * len(results), \
        results[0].stderr[-3000:]
    every_run = [('baseline', run) for run in range(8)]
    assert sorted(records(study_dir)) == every_run
    lines = [line for result in results for line in trained(result.stdout)]
    assert sorted(lines) == every_run  # each run written once, by the old and the new rank 0
    assert study_summary(study_dir)['status'] == 'complete'
    if rank == 0 or topology == 'two nodes, c10d':  # c10d restarts every node's processes
        assert 'rank 0 rejoins the launch' in ''.join(result.stdout for result in results)
    # the replacement took the killed process's run at once: --lost-after (300 s) never waited
    assert elapsed < 150, elapsed


@pytest.mark.slow
def test_a_stopped_process_has_its_run_taken_over_and_its_late_record_dropped(image_folder,
                                                                              tmp_path):
    study_dir = tmp_path / 'study'
    first = launch('airbench94', '--study-dir', str(study_dir), '--lost-after', '3', *RUNS,
                   '--data-dir', image_folder,
                   launcher=['--nproc_per_node=2', f'--master-port={free_port()}'])
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
    """The protocol itself, in one process: A's run taken over by B once A counts as dead; A's late
    record, published under its own token, is never written; B's is, once."""
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
    """The stand-in whose runs of curve.b=0.3 raise while the file that the returned path names
    exists (its processes' environment names it)."""
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
    """Rank 0 exits 2 (runs failed); torchrun --max-restarts restarts the processes, and the
    restarted launch finds every run done (the failed ones by their tries): it says so and ends,
    where it once waited for those runs for ever."""
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
    """Stopped and waited for, on an error too: a daemon thread left inside a store call when the
    interpreter exits aborts the process (exit status 134) after a study that succeeded."""
    world = distribute.World.of_environment(distribute.ResilientStore(connect=dist.HashStore))
    with pytest.raises(KeyError):
        with distribute.Heartbeat(world) as heartbeat:
            assert heartbeat.is_alive()
            raise KeyError('a refusal after the heartbeat started')
    assert not heartbeat.is_alive()


def test_outputs_larger_than_the_store_takes_arrive_intact():
    server = dist.TCPStore('127.0.0.1', 0, 1, is_master=True, wait_for_workers=False)
    store = distribute.ResilientStore(connect=lambda: dist.TCPStore(
        '127.0.0.1', server.port, 1, is_master=False))
    payload = torch.randint(0, 256, (20 << 20,), dtype=torch.uint8).numpy().tobytes()  # 20 MiB
    store.set_large('outputs/0/token', payload)  # the TCPStore refuses values above 8 MiB
    assert store.get_large('outputs/0/token') == payload
    store.delete_large('outputs/0/token')
    assert not store.check('outputs/0/token/count')


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


def test_a_dropped_tcp_connection_is_made_again():
    """Through a proxy that cuts every connection once: the client reconnects, the state stays."""
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
    store.set('kept', 'yes')
    assert store.add('counter', 2) == 2
    for connection in list(connections):  # the network drops every connection
        connection.shutdown(socket.SHUT_RDWR)
        connection.close()
    assert store.add('counter', 1) == 3 and store.get('kept') == b'yes'
    listener.close()
