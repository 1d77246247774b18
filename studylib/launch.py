"""One launch of a study, once planned (studylib.plan): all processes train from the shared queue,
rank 0 writes the records and, at the end, the summary and report; signals and exit statuses."""
import datetime
import socket
import sys
import time

import torch

from . import report
from .collect import Collector
from .device import prepare_device, recompile_limits
from .distribute import MAX_ATTEMPTS, Heartbeat, Liveness, Queue
from .errors import ReportFailed, RunsFailed, Stopped
from .records import FailedTry, Message
from .runs import Runner
from .plan import first_plan, join_plan

POLL_SECONDS = 0.5  # how often a process without a run looks for one, or for the end


def failure_record(config, run, error, runner):
    return FailedTry(config=config, run=run, error_type=type(error).__name__,
                     error=str(error)[:4000], rank=runner.world.rank, host=socket.gethostname(),
                     device=str(runner.device), device_model=runner.device_model,
                     launch=runner.launch,
                     finished=datetime.datetime.now(datetime.timezone.utc).isoformat())


def train_one(runner, config, run):
    """(record, outputs) of a run; an exception inside the run becomes a failure record (a bug in
    a copy of a script, CUDA out of memory at a large batch), and the study goes on. The record
    is made before the device is touched again: after some CUDA errors every call fails."""
    try:
        return runner.run(config, run)
    except Exception as error:  # noqa: BLE001: every failure of a run is recorded, not fatal
        return failure_record(config, run, error, runner), None


def device_failure(device):
    """After a failed run, its cached memory given back (CUDA out of memory at a large batch), or
    why the device is unusable (after an illegal memory access or a device-side assert, every CUDA
    call of the process fails); None on a CPU."""
    if device.type != 'cuda':
        return None
    try:
        torch.cuda.empty_cache()
    except Exception as error:  # noqa: BLE001: whatever CUDA raises, the process is done
        return f'its device fails every call ({type(error).__name__}: {error})'
    return None


def publish(world, queue, index, record, outputs):
    """The run's outputs, then its record, under this process's token, if it still holds the
    run's lease (else another process has taken the run over: this late result is dropped)."""
    if not queue.holds(index):
        return False
    if outputs is not None:
        world.store.set_large(f'outputs/{index}/{world.token}', outputs)
    world.store.set(f'record/{index}/{world.token}',
                    Message(record=record, has_outputs=outputs is not None).encode())
    return True


class BrokenDevice:
    """Stops a process whose runs fail in a row across configurations: its device (or process) is
    broken, and it would mark every run it takes as failed."""

    def __init__(self, limit=3):
        self.limit = limit
        self.recent = []

    def check(self, record):
        self.recent = [*self.recent, record][-self.limit:] if record.failed else []
        if len(self.recent) == self.limit and len({r.config for r in self.recent}) > 1:
            raise RunsFailed(f'{self.limit} runs in a row failed on this process (rank '
                             f'{record.rank}, {record.host}, {record.device}), in '
                             'different configurations: its device may be broken; the failures '
                             'are recorded, and the same command retries them')


def work(request, world, plan, runner, collector):
    """Train runs from the queue until the plan is done; rank 0 writes records between its runs."""
    queue = Queue(world, len(plan.jobs), request.lost_after)
    broken = BrokenDevice()
    liveness = Liveness(world.store, request.lost_after)
    while True:
        claimed = queue.claim()
        if claimed is None:
            if collector is not None:
                collector.collect()
                if collector.all_done() and not collector.awaits_compiles(liveness):
                    world.store.set('finished', '1')
                    return
            elif queue.finished():
                return
            elif world.store.check('member/0') and liveness.lost(
                    world.store.get('member/0').decode()):
                raise RunsFailed(f'rank 0 has sent no heartbeat for {request.lost_after:g} s: the '
                                 'records of this launch are written by rank 0 alone; run the '
                                 'command again to continue the study')
            time.sleep(POLL_SECONDS)
            continue
        index, attempts = claimed
        config, run = plan.jobs[index]
        if attempts > MAX_ATTEMPTS:
            record = failure_record(config, run, ProcessLost(
                f'its process was lost {attempts - 1} times (killed, out of memory, or '
                'unreachable)'), runner)
            outputs = None
        else:
            record, outputs = train_one(runner, config, run)
        publish(world, queue, index, record, outputs)
        if collector is not None:
            collector.collect()
        failure = (device_failure(runner.device) or runner.compiles_eagerly()) \
            if record.failed else None
        if failure:
            raise RunsFailed(f'this process (rank {world.rank}, {socket.gethostname()}, '
                             f'{runner.device}) stops: {failure}; the failure of {config} run '
                             f'{run} is recorded, and the same command retries it')
        broken.check(record)


class ProcessLost(Exception):
    """A run whose process was lost again and again."""


def run_study(request, world, command):
    """This process's part of the launch, its heartbeat beating throughout. Returns the exit status:
    0, or Ctrl-C's (130) or SIGTERM's (143) once the launch is planned (rank 0 says what it kept);
    rank 0 raises its failed runs and a report that could not be written."""
    replacing = world.join()
    with Heartbeat(world):
        if world.store.check('plan/count'):
            process, plan, lock = join_plan(request, world)
        else:
            process, plan, lock = first_plan(request, world, command)
        prepare_device(process.device, process.flags.deterministic)
        collector = None
        if world.rank == 0:
            collector = Collector(world, plan, request.study_dir)
            say_launch(request, world, process, plan, collector, replacing)
        try:
            report_error = train_and_report(request, world, process, plan, lock, collector)
        except (KeyboardInterrupt, Stopped) as stop:
            if collector is not None:
                print(f'\nStopped: {collector.finished()} of {collector.total} finished runs are '
                      f'in {request.study_dir}; the same command continues the study.',
                      file=sys.stderr, flush=True)
            return 130 if isinstance(stop, KeyboardInterrupt) else 143
    if collector is not None and collector.failed:
        if report_error:
            print(f'warning: {report_error}', file=sys.stderr, flush=True)
        failed = sorted(collector.failed.values(), key=lambda r: (r.config, r.run))
        shown = ', '.join(f'{r.config} run {r.run} ({r.error_type})' for r in failed[:5])
        raise RunsFailed(f'{len(failed)} runs failed: {shown}{" ..." if len(failed) > 5 else ""};'
                         f' their errors are in {request.study_dir}/runs/CONFIG/RUN.failed.json, '
                         'the summary counts them, and the same command retries them')
    if report_error:
        raise ReportFailed(report_error)
    return 0


def say_launch(request, world, process, plan, collector, replacing):
    """Rank 0's first lines: what it says of the command and of DIR, and what the launch trains."""
    for note in [*request.notes, *plan.notes]:
        print(note, flush=True)
    print(f"{'rank 0 rejoins the launch; ' if replacing else ''}study in {request.study_dir}: "
          f"{collector.finished()} of {plan.total} runs of this launch's configurations "
          f"finished, {len(plan.jobs) - len(collector.written) - len(collector.failed)} to "
          f"train; world size {world.size} on {plan.environment['hosts']} "
          f'({process.device.type}, {process.precision})', flush=True)


def train_and_report(request, world, process, plan, lock, collector):
    """Warm up, train and, on rank 0, write the records and report; its failure, or None."""
    try:
        with recompile_limits(len(process.configs)) as recompile_limit_hits:
            runner = Runner(request, process, world, plan.launch, recompile_limit_hits)
            configs = sorted({config for config, _ in plan.jobs})
            runner.warm_up(configs)
            world.publish(f'compiles/{world.rank}',
                          [record.to_json() for record in runner.compile_records])
            work(request, world, plan, runner, collector)
    except BaseException:  # stopped early: what has arrived is kept, and the report written
        report_error = close_launch(request, collector, lock)
        if report_error:
            print(f'warning: {report_error}', file=sys.stderr, flush=True)
        raise
    return close_launch(request, collector, lock)


def close_launch(request, collector, lock):
    """Rank 0 at the end of a launch, however it ends: the records that have arrived, then the
    report; DIR's lock released. Returns the report's failure, or None (other ranks: None)."""
    if collector is None:
        return None
    try:
        collector.collect()
    finally:
        try:
            report_error = report.write_report(request.study_dir, request.resolve)
        finally:
            lock.close()
    return report_error
