"""How the processes of a study share its runs: torchrun's key-value store, an atomic queue,
heartbeats, and rank 0's collector, which writes every published record into the study directory.

There is no process group and no collective: only small messages travel, and a process that dies
blocks nobody else."""
import datetime
import json
import os
import socket
import threading
import time

import torch.distributed as dist

from .plan import atomic_write, record_path

POLL_SECONDS = 0.2       # how often rank 0 looks for published records
HEARTBEAT_SECONDS = 2.0  # how often every process says that it is alive


class World:
    """This process's place among the study's processes, and the key-value store they share:
    torchrun's (env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or in one plain
    process an in-memory one. Keys are prefixed by the launch attempt (torchrun restarts)."""

    def __init__(self):
        if 'WORLD_SIZE' in os.environ:
            store, self.rank, self.size = next(dist.rendezvous('env://'))
        else:
            store, self.rank, self.size = dist.HashStore(), 0, 1
        attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
        self.store = dist.PrefixStore(f'airbench_study/{attempt}/', store)
        self.local_rank = int(os.environ.get('LOCAL_RANK', 0))
        self.node = os.environ.get('GROUP_RANK', socket.gethostname())

    def publish(self, key, value):
        self.store.set(key, json.dumps(value))

    def read(self, key):
        """The value published under key, waiting for it."""
        return json.loads(self.store.get(key))

    def read_all(self, key):
        """Every rank's value published under key/RANK, waiting for them all."""
        return [self.read(f'{key}/{rank}') for rank in range(self.size)]


class Heartbeat(threading.Thread):
    """Adds 1 to alive/RANK in the store every HEARTBEAT_SECONDS while the process lives."""

    def __init__(self, world):
        super().__init__(daemon=True)
        self.world, self.stopping = world, threading.Event()

    def run(self):
        try:
            while not self.stopping.wait(HEARTBEAT_SECONDS):
                self.world.store.add(f'alive/{self.world.rank}', 1)
        except Exception:  # the store is gone, so is the study: the main thread finds out too
            pass


class Collector(threading.Thread):
    """Rank 0: writes every record published in the store into DIR as it arrives (outputs first,
    the record last), and prints a line of progress for each. Ends when every run of the plan is
    written, or when stopping (after a last look); once finishing (no run left to claim), gives up
    the runs whose process has sent no heartbeat for lost_after seconds."""

    def __init__(self, world, plan, study_dir, lost_after):
        super().__init__(daemon=True)
        self.world, self.jobs, self.study_dir = world, plan['jobs'], study_dir
        self.lost_after = lost_after
        self.total, self.finished = plan['total'], plan['finished']
        self.claimed, self.in_flight, self.lost, self.error = 0, set(), {}, None
        self.last_beat = {}  # run index -> (its owner and heartbeat count, when they last changed)
        self.finishing, self.stopping = threading.Event(), threading.Event()
        self.start_time = time.perf_counter()

    def run(self):
        try:
            while not self.stopping.is_set() and (self.claimed < len(self.jobs) or self.in_flight):
                self.collect()
                if self.finishing.is_set():
                    self.give_up_lost()
                time.sleep(POLL_SECONDS)
            self.collect()
        except Exception as error:  # DIR unwritable, the store gone: the main thread says so
            self.error = error

    def collect(self):
        store = self.world.store
        claimed = min(store.add('next', 0), len(self.jobs))
        self.in_flight.update(range(self.claimed, claimed))
        self.claimed = claimed
        for index in sorted(self.in_flight):
            if not store.check([f'record/{index}']):
                continue
            record_text = store.get(f'record/{index}')
            config, run = self.jobs[index]
            path = record_path(self.study_dir, config, run)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if store.check([f'outputs/{index}']):
                atomic_write(path.removesuffix('.json') + '.pt', store.get(f'outputs/{index}'))
            atomic_write(path, record_text)
            for key in ('record', 'outputs', 'owner'):
                store.delete_key(f'{key}/{index}')
            self.in_flight.discard(index)
            self.progress(json.loads(record_text))

    def progress(self, record):
        self.finished += 1
        done_here = self.finished - (self.total - len(self.jobs))
        left = self.total - self.finished
        eta = (time.perf_counter() - self.start_time) / done_here * left
        flag = ' (the loss diverged)' if record['diverged'] else ''
        print(f"[{self.finished}/{self.total} done, {left} left, ETA "
              f"{datetime.timedelta(seconds=round(eta))}] {record['config']} run {record['run']}: "
              f"{record['accuracy_on']} accuracy {record['accuracy']:.4f}{flag}, "
              f"{record['total_time_seconds']:.2f} s (rank {record['rank']}, {record['host']})",
              flush=True)

    def give_up_lost(self):
        store, now = self.world.store, time.perf_counter()
        for index in sorted(self.in_flight):
            owner = int(store.get(f'owner/{index}')) if store.check([f'owner/{index}']) else None
            beat = (owner, None if owner is None else store.add(f'alive/{owner}', 0))
            if self.last_beat.get(index, (None, None))[0] != beat:
                self.last_beat[index] = (beat, now)
            elif now - self.last_beat[index][1] > self.lost_after:
                self.lost[index] = owner
                self.in_flight.discard(index)
