"""Rank 0's part: the records published in the store written into the study directory, in the
main thread between its own runs (never inside a timed region), with a line of progress each."""
import datetime
import json
import os
import time

from .plan import atomic_write, failure_path, record_path, read_records


class Collector:
    """Writes every run's record (and outputs) published by the process holding its lease, once:
    done/I marks it written. A failed run's record goes to RUN.failed.json (its tries), and the
    run is done for this launch."""

    def __init__(self, world, plan, study_dir):
        self.store, self.jobs, self.study_dir = world.store, plan['jobs'], study_dir
        self.total, self.written, self.failed = plan['total'], set(), {}
        self.finished_before = plan['total'] - len(plan['jobs'])
        self.start_time = time.perf_counter()
        on_disk = read_records(study_dir, sorted({config for config, _ in self.jobs}),
                               1 + max((run for _, run in self.jobs), default=0))
        for index, (config, run) in enumerate(self.jobs):  # a rank 0 that replaces another
            if (config, run) in on_disk:
                self.written.add(index)
                self.store.set(f'done/{index}', '1')

    def all_done(self):
        return len(self.written) + len(self.failed) == len(self.jobs)

    def pending(self):
        claimed = min(self.store.add('next', 0), len(self.jobs))
        return [index for index in range(claimed)
                if index not in self.written and index not in self.failed]

    def collect(self):
        """Write every record published so far; the number written."""
        count = 0
        for index in self.pending():
            if not self.store.check(f'lease/{index}'):
                continue
            holder = self.store.get(f'lease/{index}').decode()
            if not self.store.check(f'record/{index}/{holder}'):
                continue
            record = json.loads(self.store.get(f'record/{index}/{holder}'))
            if record.get('failed'):
                self.write_failure(index, record)
            else:
                self.write_record(index, record, holder)
            self.store.set(f'done/{index}', '1')
            self.store.delete(f'record/{index}/{holder}')
            count += 1
        return count

    def write_record(self, index, record, holder):
        path = record_path(self.study_dir, record['config'], record['run'])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if record.pop('has_outputs'):  # before the record: a record means the run is complete
            key = f'outputs/{index}/{holder}'
            atomic_write(path.removesuffix('.json') + '.pt', self.store.get_large(key))
            self.store.delete_large(key)
        failures = failure_path(self.study_dir, record['config'], record['run'])
        if os.path.exists(failures):  # a run that failed in an earlier launch, done now
            with open(failures) as f:
                record['earlier_failures'] = len(json.load(f)['failures'])
            os.remove(failures)
        atomic_write(path, json.dumps(record, indent=2))
        self.written.add(index)
        self.progress(record)

    def write_failure(self, index, record):
        path = failure_path(self.study_dir, record['config'], record['run'])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        failures = []
        if os.path.exists(path):
            with open(path) as f:
                failures = json.load(f)['failures']
        atomic_write(path, json.dumps(dict(config=record['config'], run=record['run'],
                                           failures=[*failures, record]), indent=2))
        self.failed[index] = record
        self.progress(record)

    def progress(self, record):
        finished = self.finished_before + len(self.written)
        done_here = len(self.written) + len(self.failed)
        left = len(self.jobs) - done_here
        eta = (time.perf_counter() - self.start_time) / done_here * left
        where = f"rank {record['rank']}, {record['host']}"
        if record.get('failed'):
            message = (record['error'].splitlines() or [''])[0][:200]
            what = f"FAILED ({record['error_type']}: {message})"
        else:
            flag = ' (the loss diverged)' if record['diverged'] else ''
            what = (f"{record['accuracy_on']} accuracy {record['accuracy']:.4f}{flag}, "
                    f"{record['total_time_seconds']:.2f} s")
        print(f'[{finished}/{self.total} done, {left} left, ETA '
              f'{datetime.timedelta(seconds=round(eta))}] {record["config"]} run '
              f"{record['run']}: {what} ({where})", flush=True)
