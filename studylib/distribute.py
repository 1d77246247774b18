"""How the processes of a study share its runs, through the key-value store that torchrun serves
(in one plain process, an in-memory one). No process group and no collective: only small messages
travel, and a process that dies blocks nobody.

The store outlives the processes of a launch (torchrun's agent serves it): a restarted process
(torchrun --max-restarts) joins the running launch, as does a replacement for rank 0. The keys
(under airbench_study/):
- plan: the launch's runs to train (rank 0 publishes it once, from the records in DIR);
- next: the queue, an atomic counter of handed-out runs;
- lease/I: the process (its token) that trains run I; a run whose process died (its successor of
  the same rank said so: dead/TOKEN) or stopped heart-beating for --lost-after seconds is taken
  over with compare_set, so it is trained once more, never by two at a time; attempts/I counts
  the takeovers;
- beat/TOKEN: each process's heartbeat counter;
- record/I/TOKEN and outputs/I/TOKEN/K: a finished (or failed) run's record and its outputs in
  chunks, from the lease's holder; rank 0 writes a record only while its lease is the
  publisher's (a late record from a replaced process is dropped), then sets done/I;
- done_below: every run below it is done (rank 0 moves it on), where the takeovers look from;
- finished: set by rank 0 once every run is done; the other processes then end.
Every store call retries with backoff and reconnects for up to STORE_PATIENCE seconds, so a
dropped connection or a store restarted in that time costs a pause, not the study.
"""
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

HEARTBEAT_SECONDS = 2.0   # how often every process says that it is alive
JOIN_SECONDS = 10.0       # the longest wait for the heartbeat to stop (a store call in flight)
STORE_PATIENCE = 120.0    # how long a store call retries before the store counts as lost
CHUNK_BYTES = 1 << 20     # outputs travel in chunks well under the TCPStore's value limit
MAX_OUTPUT_BYTES = 1 << 30  # a run's outputs above this are refused before any training
MAX_ATTEMPTS = 3          # takeovers of one run (its process lost each time) before it counts
#                           as failed for this launch


class StoreLost(Exception):
    """The store did not answer for STORE_PATIENCE seconds."""


def connect_store():
    """A client of torchrun's store (its agent's, which outlives the workers), a store served by
    rank 0 (torch.distributed's env:// variables without torchrun), or an in-memory one."""
    if 'WORLD_SIZE' not in os.environ:
        return dist.HashStore()
    host = os.environ['MASTER_ADDR']
    port = int(os.environ['MASTER_PORT'])
    agent_store = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    server = not agent_store and os.environ['RANK'] == '0'
    return dist.TCPStore(host, port, int(os.environ['WORLD_SIZE']), is_master=server,
                         wait_for_workers=False, multi_tenant=server)


class ResilientStore:
    """The store, with every call retried (and the connection remade) for STORE_PATIENCE seconds.
    Calls never block on a missing key: waiting is wait_for's polling."""

    def __init__(self, connect=connect_store, prefix='airbench_study/', patience=STORE_PATIENCE):
        self.connect = connect
        self.prefix = prefix
        self.patience = patience
        self.lock = threading.Lock()  # the heartbeat thread shares the connection
        self.store = connect()

    def call(self, method, *args):
        delay = 0.05
        deadline = time.monotonic() + self.patience
        while True:
            try:
                with self.lock:
                    return getattr(self.store, method)(*args)
            except (RuntimeError, OSError, ValueError) as error:  # DistError is a RuntimeError
                if time.monotonic() > deadline:
                    raise StoreLost(f'the store did not answer for {self.patience:g} s '
                                    f'({type(error).__name__}: {error})') from None
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                try:
                    with self.lock:
                        self.store = self.connect()
                except (RuntimeError, OSError, ValueError):
                    pass

    def set(self, key, value):
        self.call('set', self.prefix + key, value)

    def get(self, key):
        return self.call('get', self.prefix + key)

    def add(self, key, amount):
        return self.call('add', self.prefix + key, amount)

    def check(self, key):
        return self.call('check', [self.prefix + key])

    def delete(self, key):
        self.call('delete_key', self.prefix + key)

    def compare_set(self, key, expected, desired):
        """desired if the key held expected ('' for a key that does not exist), and the value it
        holds after the call."""
        return self.call('compare_set', self.prefix + key, expected, desired)

    def wait_for(self, key, give_up=None, poll_seconds=0.1):
        """Poll until key exists; give_up() may raise to stop waiting."""
        while not self.check(key):
            if give_up is not None:
                give_up()
            time.sleep(poll_seconds)

    def set_large(self, key, data):
        """bytes of any size, in chunks: key/K for each chunk, then key/count."""
        chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b'']
        for index, chunk in enumerate(chunks):
            self.set(f'{key}/{index}', chunk)
        self.set(f'{key}/count', str(len(chunks)))

    def get_large(self, key):
        count = int(self.get(f'{key}/count'))
        return b''.join(self.get(f'{key}/{index}') for index in range(count))

    def delete_large(self, key):
        if self.check(f'{key}/count'):
            for index in range(int(self.get(f'{key}/count'))):
                self.delete(f'{key}/{index}')
            self.delete(f'{key}/count')


@dataclass(frozen=True)
class World:
    """This process's place among the study's processes. node: torchrun's GROUP_RANK, or the
    host; token: what names this process in leases and heartbeats."""
    rank: int
    size: int
    local_rank: int
    node: str
    store: ResilientStore
    token: str

    @classmethod
    def of_environment(cls, store=None):
        """This process's World, from torchrun's environment (a lone process: rank 0 of 1, with
        an in-memory store where none is given)."""
        rank = int(os.environ.get('RANK', 0))
        return cls(rank=rank, size=int(os.environ.get('WORLD_SIZE', 1)),
                   local_rank=int(os.environ.get('LOCAL_RANK', 0)),
                   node=os.environ.get('GROUP_RANK', socket.gethostname()),
                   store=store or ResilientStore(),
                   token=f'{rank}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}')

    def join(self):
        """Say that this process is rank's now: the process it replaces (a torchrun restart) is
        dead, and its run can be taken over at once."""
        previous = self.store.compare_set(f'member/{self.rank}', '', self.token).decode()
        if previous != self.token:
            self.store.set(f'dead/{previous}', '1')
            self.store.set(f'member/{self.rank}', self.token)
        return previous != self.token

    def publish(self, key, value):
        self.store.set_large(key, json.dumps(value).encode())

    def read(self, key, give_up=None):
        self.store.wait_for(f'{key}/count', give_up)
        return json.loads(self.store.get_large(key))

    def read_all(self, key):
        return [self.read(f'{key}/{rank}') for rank in range(self.size)]


class Heartbeat(threading.Thread):
    """Adds 1 to beat/TOKEN every HEARTBEAT_SECONDS inside its with block; a store error never ends
    it. Leaving the block stops the thread and waits for it: a daemon thread still inside a store
    call at interpreter exit is ended by pthread_exit inside torch's C++, which aborts the process
    (std::terminate, exit status 134) after a study that succeeded. The wait is bounded
    (JOIN_SECONDS) for a lost store, whose calls retry for STORE_PATIENCE seconds."""

    def __init__(self, world):
        super().__init__(daemon=True)
        self.world = world
        self.stopping = threading.Event()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.stopping.set()
        self.join(timeout=JOIN_SECONDS)

    def run(self):
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            try:
                self.world.store.add(f'beat/{self.world.token}', 1)
            except StoreLost:
                continue


class Liveness:
    """Whether the holder of a lease is alive, as this process sees it: a token named dead by its
    successor is dead; one whose heartbeat has not moved for lost_after seconds (of this process's
    clock, from when it first looked) is lost."""

    def __init__(self, store, lost_after):
        self.store = store
        self.lost_after = lost_after
        self.seen = {}

    def lost(self, token):
        if self.store.check(f'dead/{token}'):
            return True
        beats = self.store.add(f'beat/{token}', 0)
        now = time.monotonic()
        last = self.seen.get(token)
        if last is None or last[0] != beats:
            self.seen[token] = (beats, now)
            return False
        return now - last[1] > self.lost_after


class Queue:
    """The runs of the plan, handed out once each: in order from the counter next, then runs whose
    holder is lost (taken over), until every run is done. That search starts at done_below and
    skips runs known done, so it costs the runs still out, not the study's."""

    def __init__(self, world, num_jobs, lost_after):
        self.world = world
        self.store = world.store
        self.num_jobs = num_jobs
        self.liveness = Liveness(world.store, lost_after)
        self.known_done = set()

    def lease(self, index, holder=''):
        """Take run index's lease from holder ('' for none); True if this process holds it now."""
        return self.store.compare_set(f'lease/{index}', holder, self.world.token).decode() == \
            self.world.token

    def holds(self, index):
        return self.store.check(f'lease/{index}') and \
            self.store.get(f'lease/{index}').decode() == self.world.token

    def claim(self):
        """(index, attempts) of a run this process now holds, or None when none is free now."""
        index = self.store.add('next', 1) - 1  # the next run no process has taken
        while index < self.num_jobs:
            if self.lease(index):
                return index, 1
            index = self.store.add('next', 1) - 1
        start = int(self.store.get('done_below')) if self.store.check('done_below') else 0
        for index in range(start, self.num_jobs):
            if index in self.known_done:
                continue
            if self.store.check(f'done/{index}'):
                self.known_done.add(index)
                continue
            holder = self.store.get(f'lease/{index}').decode() if \
                self.store.check(f'lease/{index}') else ''
            if holder == self.world.token or (holder and not self.liveness.lost(holder)):
                continue
            if self.lease(index, holder):
                return index, self.store.add(f'attempts/{index}', 1) + 1
        return None

    def finished(self):
        return self.store.check('finished')
