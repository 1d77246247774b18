"""Compiling a launch's configurations once per machine, before its runs. Each configuration whose
network compiles (a compiled script's, on this device) gets a process of its own, --compile-jobs
at once, that runs its warmup into the inductor cache the machine's processes share (compile_job,
`python -m studylib.compiling`); every process that trains it then warms up from that cache.
Under torchrun the P processes of a machine share its configurations (each compiles every P-th)
and wait for each other, so each graph is compiled once, not P times.

Machines do not send each other what they compiled: each compiles for itself (their GPU model,
driver or torch may differ, and inductor's cache keys with them); machines that share a file
system share the work when TORCHINDUCTOR_CACHE_DIR points them at one directory."""
import concurrent.futures
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from .device import (compile_counts, compiles_network, enable_compile_caches, prepare_device,
                     recompile_limits)
from .distribute import Liveness
from .records import CompileRecord
from .runs import warm_up_network, warmup_inputs, warmup_key
from .scripts import load_script, method_of

STAGE = 'before the runs'  # CompileRecord.stage of a configuration's own compiling process
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class CompileJob:
    """What a compiling process needs to make the graphs of a configuration's runs: its script
    file, hyp, device and precision, and the shapes of a run's warmup (num_test 0: no outputs)."""
    config: str
    script: str
    hyp: dict
    device: str
    precision: str
    deterministic: bool
    num_classes: int
    num_eval: int
    num_test: int
    save_plain: bool
    mean: tuple
    std: tuple


# A compile is dynamo's and inductor's Python on one core, then inductor's kernel builds on a
# worker per core it is given. Two compiles at once on 2 cores (a worker each) reached a study's
# first record later than compiling in the warmups, one after another (docs/cpu.md, "Compiling a
# study's configurations"); how many at once suit a GPU machine's cores is for a GPU to measure.
CORES_PER_COMPILE = 4


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def default_compile_jobs():
    return max(1, usable_cores() // CORES_PER_COMPILE)


def compile_job(job):
    """Run a configuration's warmup in this process, as a process of the study warms it up, into
    the machine's inductor cache: {'seconds', 'graphs', 'compiled', 'from_cache'}."""
    device = torch.device(job.device)
    prepare_device(device, job.deterministic)
    enable_compile_caches()
    script = method_of(load_script(job.script))
    counts_before = compile_counts()
    start = time.perf_counter()
    net = script.build_net(job.hyp['net'], job.num_classes, device, job.precision)
    inputs = warmup_inputs(script, job.hyp, job.num_classes, job.num_eval, job.num_test,
                           job.mean, job.std, job.precision, device)
    with recompile_limits(1):
        warm_up_network(script, job.hyp, net, device, job.precision, inputs, job.save_plain)
    graphs, compiled, from_cache = (now - before for now, before in
                                    zip(compile_counts(), counts_before))
    return dict(seconds=time.perf_counter() - start, graphs=graphs, compiled=compiled,
                from_cache=from_cache)


def run_compile_process(job, compile_threads):
    """(wall seconds, compile_job's result or {'error'}) of job run in a process of its own."""
    environment = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(compile_threads),
                       PYTHONPATH=os.pathsep.join(filter(None, [REPO,
                                                                os.environ.get('PYTHONPATH')])))
    start = time.perf_counter()
    finished = subprocess.run([sys.executable, '-m', 'studylib.compiling'],
                              input=pickle.dumps(job), capture_output=True, env=environment)
    seconds = time.perf_counter() - start
    lines = finished.stdout.decode(errors='replace').strip().splitlines()
    try:
        return seconds, json.loads(lines[-1])
    except (IndexError, ValueError):
        error = (finished.stderr.decode(errors='replace').strip().splitlines() or
                 ['no output'])[-1]
        return seconds, dict(error=f'its process exited {finished.returncode} ({error[:300]})')


class Compiler:
    def __init__(self, runner, world, jobs_at_once):
        self.runner = runner
        self.world = world
        self.jobs_at_once = jobs_at_once
        self.local_size = int(os.environ.get('LOCAL_WORLD_SIZE', 1))

    def compiled_configs(self, configs):
        """The first configuration of each (script, hyp) to warm up whose network compiles."""
        seen = set()
        compiled = []
        for config in configs:
            key = warmup_key(self.runner.script(config).path, self.runner.configs[config].hyp)
            if key not in seen and compiles_network(self.runner.net(config)):
                compiled.append(config)
            seen.add(key)
        return compiled

    def compile(self, configs):
        """This process's CompileRecords of compiling the configurations into the machine's cache
        before their warmups, where separate processes save time (several configurations at once,
        or several processes of the machine that would each compile them). Local rank r of P
        compiles the r-th, (r + P)-th, ..., then waits for the others' before its warmups."""
        compiled = self.compiled_configs(configs)
        if compiled:
            enable_compile_caches()  # torch 2.4's default is off: the warmups load from it
        # Fewer than 2 compiles at once, in processes to start, came later than the warmups'
        # compiles on 2 cores, under torchrun too (docs/cpu.md, "Compiling a study's
        # configurations"); one configuration in one process gains nothing from a process
        if self.jobs_at_once < 2 or not compiled or (len(compiled) < 2 and self.local_size < 2):
            return []
        share = compiled[self.world.local_rank::self.local_size]
        done_key = self.done_key(self.world.local_rank)
        records = []
        if share and not self.world.store.check(done_key):  # restarted: it compiled them before
            records = self.compile_all(share)
        self.world.store.set(done_key, '1')
        for local_rank in range(min(self.local_size, len(compiled))):
            self.wait_for(local_rank)
        return records

    def done_key(self, local_rank):
        return f'compiled/{self.runner.launch}/{self.world.node}/{local_rank}'

    def wait_for(self, local_rank):
        """Wait for the machine's process of local_rank to compile its share (the warmups then
        load it); if that process is lost, go on: this process's warmups compile what they need."""
        first = self.world.rank - self.world.local_rank  # a machine's ranks are consecutive
        rank = first + local_rank
        liveness = Liveness(self.world.store, self.runner.request.lost_after)

        def give_up():
            member = f'member/{rank}'
            if self.world.store.check(member) and liveness.lost(
                    self.world.store.get(member).decode()):
                raise TimeoutError
        try:
            self.world.store.wait_for(self.done_key(local_rank), give_up, poll_seconds=0.5)
        except TimeoutError:
            print(f'rank {self.world.rank}: rank {rank} of {socket.gethostname()} was lost while '
                  'compiling; this process compiles its configurations in its warmups', flush=True)

    def job(self, config):
        runner = self.runner
        return CompileJob(
            config=config, script=runner.script(config).path, hyp=runner.configs[config].hyp,
            device=str(runner.device), precision=runner.precision,
            deterministic=runner.flags.deterministic, num_classes=len(runner.data['classes']),
            num_eval=len(runner.eval_split['labels']),
            num_test=len(runner.test_split['labels']) if runner.evaluates_test_set() else 0,
            save_plain=runner.request.save_logits,
            mean=tuple(runner.data['mean']), std=tuple(runner.data['std']))

    def compile_all(self, configs):
        """Each configuration in a process of its own, this process's part of --compile-jobs at a
        time (the machine's processes share it, and its cores); a line each."""
        at_once = min(max(1, self.jobs_at_once // self.local_size), len(configs))
        compile_threads = max(1, usable_cores() // (at_once * self.local_size))
        jobs = [self.job(config) for config in configs]
        print(f'compiling {len(configs)} configuration{"s" if len(configs) > 1 else ""} on '
              f'{socket.gethostname()} before the runs, {at_once} at once: '
              f'{", ".join(configs)}', flush=True)
        records = []
        with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
            futures = {pool.submit(run_compile_process, job, compile_threads): job
                       for job in jobs}
            for future in concurrent.futures.as_completed(futures):
                seconds, result = future.result()
                records.append(self.record(futures[future].config, seconds, result))
                print(self.line(records[-1]), flush=True)
        return sorted(records, key=lambda record: configs.index(record.config))

    def record(self, config, seconds, result):
        runner = self.runner
        return CompileRecord(config=config, launch=runner.launch, stage=STAGE,
                             rank=self.world.rank, host=socket.gethostname(),
                             device=str(runner.device), device_model=runner.device_model,
                             seconds=seconds, graphs=result.get('graphs', 0),
                             compiled=result.get('compiled', 0),
                             from_cache=result.get('from_cache', 0), error=result.get('error'))

    def line(self, record):
        if record.error is not None:
            return (f'compiling {record.config} before the runs failed after '
                    f'{record.seconds:.1f} s ({record.error}); its warmups compile it')
        return (f'compiled {record.config} before the runs in {record.seconds:.1f} s on '
                f'{record.host}: {record.graphs} graphs, {record.compiled} compiled by inductor, '
                f'{record.from_cache} from its cache')


def main():
    """A compiling process: the CompileJob pickled on stdin (its hyp exactly as the launch's,
    tuples included); what compile_job returns (or the error) as the last line of stdout."""
    job = pickle.load(sys.stdin.buffer)
    try:
        result = compile_job(job)
    except Exception as error:  # noqa: BLE001: said to the launch, whose warmups compile instead
        result = dict(error=f'{type(error).__name__}: {error}'.splitlines()[0][:500])
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
