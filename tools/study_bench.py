"""The study engine's overhead, measured: studies of tests/stand_in_script.py (whose train returns
at once, with accuracies from a known curve) on 1 process and on 2 under torchrun, at 1,000 and
10,000 runs, with or without saved logits; then `study.py report` on the same directory.

Usage: python tools/study_bench.py [--runs 1000,10000] [--processes 1,2] [--save-logits]
                                   [--classes 10] [--test-images 10000] [--keep DIR]

For each study it prints a row: the launch's wall time and its start (to the first record); its
steady rate (runs per second between the first and the last record) and the engine's overhead per
run and process (processes / rate, which includes the stand-in's own few milliseconds, printed
apart), as a fraction of an A100 run of airbench94_muon (2.59 s); the launch's final report (from
its last record to its end: the report from the records and logits, and the processes' exit);
`study.py report DIR` run again afterwards (what the report keeps in DIR, such as the logits'
tallies, is reused) and its plots; the peak resident memory of the largest process and of all of
them together (sampled every 0.2 s). Each process runs one thread
(OMP_NUM_THREADS=1), as torchrun gives its workers. The data is a synthetic tensor cache of the
given classes and test images (and 2,048 training images), which the scripts read as CIFAR-10.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAND_IN = os.path.join(REPO, 'tests', 'stand_in_script.py')
A100_RUN_SECONDS = 2.59  # airbench94_muon on an A100 (its header)
PROGRESS = '['  # rank 0's line per written record starts with [K/N done


def write_data(data_dir, classes, test_images, train_images=2048):
    """A tensor cache that studylib.data.load_study_data takes as CIFAR-10's: random images and labels."""
    import torch
    generator = torch.Generator().manual_seed(0)

    def split(n):
        return {'images': torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8,
                                        generator=generator),
                'labels': torch.randint(0, classes, (n,), generator=generator)}
    os.makedirs(data_dir, exist_ok=True)
    torch.save(dict(train=split(train_images), test=split(test_images),
                    classes=[str(c) for c in range(classes)], mean=(0.5,) * 3, std=(0.25,) * 3,
                    version=2, dataset='cifar10', train_splits=['train'], fingerprint=None),
               os.path.join(data_dir, 'airbench_cache.pt'))


def tree_rss(pid):
    """{pid: resident bytes} of pid and its descendants (from /proc)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parent = int(f.read().rpartition(')')[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, frontier, rss = [], [pid], {}
    while frontier:
        found.append(frontier.pop())
        frontier += children.get(found[-1], [])
    for process in found:
        try:
            with open(f'/proc/{process}/status') as f:
                for line in f:
                    if line.startswith('VmRSS:'):
                        rss[process] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss


class MemorySampler(threading.Thread):
    """The peak resident memory of a process tree: of its largest process, and of all together."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.stopping, self.largest, self.total = pid, threading.Event(), 0, 0

    def run(self):
        while not self.stopping.wait(0.2):
            rss = tree_rss(self.pid)
            self.largest = max(self.largest, max(rss.values(), default=0))
            self.total = max(self.total, sum(rss.values()))


def timed(command, env):
    """(seconds, the times of rank 0's progress lines, the last lines of output, peak memory) of a
    command, its output read line by line as it comes."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    sampler = MemorySampler(process.pid)
    sampler.start()
    progress, tail = [], []
    for line in process.stdout:
        if line.startswith(PROGRESS):
            progress.append(time.perf_counter() - start)
        tail = [*tail[-20:], line]
    process.wait()
    sampler.stopping.set()
    sampler.join()
    if process.returncode != 0:
        sys.exit(f'error: {" ".join(command)} failed ({process.returncode}):\n{"".join(tail)}')
    return time.perf_counter() - start, progress, tail, (sampler.largest, sampler.total)


def free_port():
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def launch_command(processes, runs, study_dir, data_dir, save_logits):
    study = [os.path.join(REPO, 'study.py'), STAND_IN, '--runs', str(runs), '--study-dir',
             study_dir, *(['--save-logits'] if save_logits else []), '--', '--data-dir', data_dir,
             '--device', 'cpu']
    if processes == 1:
        return [sys.executable, *study]
    return [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={processes}',
            f'--master-port={free_port()}', *study]


REPORT_CHILD = '''
import functools, json, sys, time
sys.path.insert(0, {repo!r})
import study, studylib
spent, depth = [0.0], [0]
def timing(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        depth[0] += 1
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                spent[0] += time.perf_counter() - start
    return wrapper
for name, module in list(sys.modules.items()):  # every plotting function, wherever it is named
    if name.startswith('studylib.'):
        for attribute, value in list(vars(module).items()):
            home = getattr(value, '__module__', None) or ''
            if callable(value) and not isinstance(value, type) and home.startswith('studylib') \\
                    and ('plot' in attribute or 'plot' in home):
                setattr(module, attribute, timing(value))
start = time.perf_counter()
status = study.main(['report', {study_dir!r}])
print(json.dumps(dict(status=status, seconds=time.perf_counter() - start, plots=spent[0])))
'''


def measure_report(study_dir, env):
    """`study.py report DIR` in a new process: its seconds (imports excluded), its plots' and its
    peak memory."""
    command = [sys.executable, '-c', REPORT_CHILD.format(repo=REPO, study_dir=study_dir)]
    _, _, tail, memory = timed(command, env)
    result = json.loads(tail[-1])
    if result['status'] != 0:
        sys.exit(f'error: study.py report {study_dir} failed:\n{"".join(tail)}')
    return result['seconds'], result['plots'], memory


def stand_in_milliseconds(classes, test_images, save_logits):
    """The stand-in's own time per run (train, and infer twice with saved logits), in one thread:
    what the overhead per run includes that is not the engine's."""
    import torch
    sys.path.insert(0, os.path.join(REPO, 'tests'))
    import stand_in_script as script
    torch.set_num_threads(1)
    labels = torch.randint(0, classes, (test_images,))
    data = dict(train=dict(labels=torch.zeros(2048)), test=dict(labels=labels),
                classes=list(range(classes)))
    images = torch.zeros(test_images, 3, 32, 32)
    start, repeats = time.perf_counter(), 20
    for seed in range(repeats):
        result = script.train(data, script.hyp, torch.device('cpu'), 'fp32', seed)
        for level in ((2, 0) if save_logits else ()):
            script.infer(result['net'], images, level, None)
    return 1000 * (time.perf_counter() - start) / repeats


def gib(size):
    return f'{size / 2**30:.2f}'


def measure(processes, runs, args, work_dir, env):
    study_dir = os.path.join(work_dir, f'study-{processes}p-{runs}')
    shutil.rmtree(study_dir, ignore_errors=True)
    command = launch_command(processes, runs, study_dir, os.path.join(work_dir, 'data'),
                             args.save_logits)
    uptime = os.getloadavg()
    wall, progress, _, (largest, total) = timed(command, env)
    if len(progress) != runs:
        sys.exit(f'error: {len(progress)} records written of {runs}')
    rate = (runs - 1) / (progress[-1] - progress[0])
    report, plots, (report_largest, _) = measure_report(study_dir, env)
    overhead = processes / rate
    print(f'| {processes} | {runs} | {"yes" if args.save_logits else "no"} | {wall:.1f} | '
          f'{progress[0]:.1f} | {rate:.1f} | {1000 * overhead:.1f} | '
          f'{100 * overhead / A100_RUN_SECONDS:.2f}% | {wall - progress[-1]:.1f} | {report:.1f} | '
          f'{plots:.1f} | {gib(largest)} | {gib(total)} | {gib(report_largest)} | '
          f'{uptime[0]:.1f} |', flush=True)
    if not args.keep:
        shutil.rmtree(study_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--runs', default='1000,10000', help='runs of the studies, comma-separated')
    parser.add_argument('--processes', default='1,2', help='processes of the studies (2: torchrun)')
    parser.add_argument('--save-logits', action='store_true', help='keep every run\'s logits')
    parser.add_argument('--classes', type=int, default=10)
    parser.add_argument('--test-images', type=int, default=10000)
    parser.add_argument('--keep', metavar='DIR', help='work in DIR and keep the studies '
                        '(default: a temporary directory, removed)')
    args = parser.parse_args()
    work_dir = args.keep or tempfile.mkdtemp(prefix='study_bench_')
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(key, None)
    try:
        write_data(os.path.join(work_dir, 'data'), args.classes, args.test_images)
        print(f'{os.cpu_count()} CPUs; the stand-in\'s own work: '
              f'{stand_in_milliseconds(args.classes, args.test_images, args.save_logits):.1f} ms '
              f'per run; data: {args.classes} classes, {args.test_images} test images\n')
        print('| processes | runs | logits | wall s | start s | runs/s | overhead ms/run/process | '
              'of an A100 run | final report s | study.py report again s | its plots s | peak GiB, '
              'largest process | peak GiB, all | report again, peak GiB | load (1 min) |')
        print('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')
        for runs in map(int, args.runs.split(',')):
            for processes in map(int, args.processes.split(',')):
                measure(processes, runs, args, work_dir, env)
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == '__main__':
    main()
