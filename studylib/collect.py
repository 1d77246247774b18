"""Rank 0's part: the records published in the store written into the study directory, in the
main thread between its own runs (never inside a timed region), with a line of progress each. Its
work per run is the same at any number of runs: it looks only at the runs handed out and not yet
written, and lists DIR once per launch."""
import datetime
import json
import os
import time

from .config import Study
from .files import (Damaged, StudyDir, atomic_write, read_failures, scan_runs, set_aside,
                    write_compiles)
from .records import CompileRecord, FailedTry, Message


class Collector:
    """Writes every run's record (and outputs) published by the process holding its lease, once:
    done/I marks it written. A failed try goes to RUN.failed.json (the run's tries), and the run is
    done for this launch. done_below tells the queue that every run below it is done."""

    def __init__(self, world, plan, study_dir):
        self.store = world.store
        self.jobs = plan.jobs
        self.study_dir = study_dir
        self.files = StudyDir(study_dir)
        self.launch = plan.launch
        self.world_size = world.size
        self.compile_records = []  # every process's CompileRecords, as each publishes them
        self.compiles_from = set()  # the ranks whose CompileRecords are written
        self.total = plan.total
        self.written = set()
        self.failed = {}
        self.finished_before = plan.total - len(plan.jobs)
        self.start_time = time.perf_counter()
        self.claimed = 0
        self.outstanding = set()
        self.done_below = 0
        study = Study.read(study_dir)
        on_disk = scan_runs(study_dir, study)[0] if study is not None else {}
        for index, (config, run) in enumerate(self.jobs):  # a rank 0 that replaces another
            if (config, run) in on_disk:
                self.written.add(index)
                self.store.set(f'done/{index}', '1')
            elif self.store.check(f'done/{index}'):  # failed in this launch: its try is written
                self.failed[index] = self.last_try(config, run)
        self.advance()

    def last_try(self, config, run):
        """The failed try of a run, as the rank 0 that this one replaces wrote it."""
        try:
            return FailedTry.from_json(read_failures(
                self.files.failures(config, run))['failures'][-1])
        except (ValueError, KeyError, TypeError, IndexError):
            return FailedTry(config=config, run=run, error_type='unknown', error='its tries '
                             'could not be read', rank=-1, host='', device='', device_model='',
                             launch='', finished='')

    def all_done(self):
        return len(self.written) + len(self.failed) == len(self.jobs)

    def pending(self):
        """The runs handed out and neither written nor failed, in order."""
        claimed = min(self.store.add('next', 0), len(self.jobs))
        self.outstanding.update(index for index in range(self.claimed, claimed)
                                if index not in self.written)
        self.claimed = max(self.claimed, claimed)
        return sorted(self.outstanding)

    def advance(self):
        start = self.done_below
        while self.done_below < len(self.jobs) and (self.done_below in self.written or
                                                    self.done_below in self.failed):
            self.done_below += 1
        if self.done_below != start or start == 0:
            self.store.set('done_below', str(self.done_below))

    def collect_compiles(self):
        """Write DIR/compiles/LAUNCH.json anew when processes have published their CompileRecords
        (each once, after its warmups; until all have, a look at each that has not)."""
        if len(self.compiles_from) == self.world_size:
            return
        ranks = [rank for rank in range(self.world_size) if rank not in self.compiles_from and
                 self.store.check(f'compiles/{rank}/count')]
        for rank in ranks:
            content = json.loads(self.store.get_large(f'compiles/{rank}'))
            self.compile_records += [CompileRecord.from_json(entry) for entry in content]
            self.compiles_from.add(rank)
        if ranks:
            write_compiles(self.study_dir, self.launch, self.compile_records)

    def awaits_compiles(self, liveness):
        """Whether a live process has still to publish its CompileRecords (it does after its
        warmups, which may end after the last run): rank 0 ends the launch once none has, so that
        compiles/LAUNCH.json holds every process's warmups."""
        self.collect_compiles()
        members = [rank for rank in range(self.world_size) if rank not in self.compiles_from and
                   self.store.check(f'member/{rank}')]
        return any(not liveness.lost(self.store.get(f'member/{rank}').decode())
                   for rank in members)

    def collect(self):
        """Write every record published so far; the number written."""
        self.collect_compiles()
        count = 0
        for index in self.pending():
            if not self.store.check(f'lease/{index}'):
                continue
            holder = self.store.get(f'lease/{index}').decode()
            if not self.store.check(f'record/{index}/{holder}'):
                continue
            message = Message.decode(self.store.get(f'record/{index}/{holder}'))
            if message.record.failed:
                self.write_failure(index, message.record)
            else:
                self.write_record(index, message, holder)
            self.store.set(f'done/{index}', '1')
            self.store.delete(f'record/{index}/{holder}')
            self.outstanding.discard(index)
            count += 1
        if count:
            self.advance()
        return count

    def write_record(self, index, message, holder):
        record = message.record
        path = self.files.record(record.config, record.run)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        key = f'outputs/{index}/{holder}'
        if message.has_outputs:  # before the record: a record means the run is complete
            atomic_write(self.files.outputs(record.config, record.run),
                         self.store.get_large(key))
        failures = self.files.failures(record.config, record.run)
        if os.path.exists(failures):  # a run that failed in an earlier launch, done now
            record.earlier_failures = len(self.earlier_tries(failures))
        atomic_write(path, json.dumps(record.to_json(), indent=2))
        if message.has_outputs:  # kept in the store until then: a failed write can be retried
            self.store.delete_large(key)
        if os.path.exists(failures):
            os.remove(failures)
        self.written.add(index)
        self.progress(record)

    def write_failure(self, index, record):
        path = self.files.failures(record.config, record.run)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        failures = self.earlier_tries(path) if os.path.exists(path) else []
        atomic_write(path, json.dumps(dict(config=record.config, run=record.run,
                                           failures=[*failures, record.to_json()]), indent=2))
        self.failed[index] = record
        self.progress(record)

    def earlier_tries(self, path):
        """The tries a RUN.failed.json holds; one that cannot be read is set aside (kept) and
        counts none."""
        try:
            return read_failures(path)['failures']
        except ValueError as error:
            relative = os.path.relpath(path, self.study_dir)
            set_aside(self.study_dir, [Damaged(relative, 'unreadable', str(error))])
            return []

    def finished(self):
        """Finished runs of this launch's configurations, those of earlier launches included."""
        return self.finished_before + len(self.written)

    def progress(self, record):
        done_here = len(self.written) + len(self.failed)
        left = len(self.jobs) - done_here
        eta = (time.perf_counter() - self.start_time) / done_here * left
        where = f'rank {record.rank}, {record.host}'
        if record.failed:
            message = (record.error.splitlines() or [''])[0][:200]
            what = f'FAILED ({record.error_type}: {message})'
        else:
            flag = ' (the loss diverged)' if record.diverged else ''
            what = (f'{record.accuracy_on} accuracy {record.accuracy:.4f}{flag}, '
                    f'{record.total_time_seconds:.2f} s')
        print(f'[{self.finished()}/{self.total} done, {left} left, ETA '
              f'{datetime.timedelta(seconds=round(eta))}] {record.config} run {record.run}: '
              f'{what} ({where})', flush=True)
