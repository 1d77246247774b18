"""Shared helpers: the tiers (quick by default, `--tier slow`, `--tier all`), the scripts under
test (loaded by studylib's loader), small datasets, and running a script as a user does. The
repository and its tools/ are on the path: tests import studylib and the tools by name."""
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, 'tools')]
TIERS = ('quick', 'slow', 'all')

from gpu_check import MAIN_WITH_HYP, TINY_WIDTHS, tiny_hyp  # noqa: E402
from studylib.hyp import with_entries  # noqa: E402
from studylib.scripts import load_script  # noqa: E402


def pytest_addoption(parser):
    parser.addoption('--tier', choices=TIERS, default='quick', help=(
        'quick (the default): the method, every flag and hyp check, the study engine in one '
        'process, the statistics, in minutes; slow: the tests marked slow (processes, torchrun '
        'and restarts, real data, compilation, coverage simulations); all: both, as CI runs them '
        '(docs/tests.md)'))


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: starts processes, trains on real data, compiles '
                            'with inductor or simulates at length: run by --tier slow or all')


def pytest_collection_modifyitems(config, items):
    """Keep the tests of the chosen tier; the others are deselected (and counted as such)."""
    tier = config.getoption('--tier')
    if tier == 'all':
        return
    slow = [item.get_closest_marker('slow') is not None for item in items]
    config.hook.pytest_deselected(items=[item for item, s in zip(items, slow)
                                         if s != (tier == 'slow')])
    items[:] = [item for item, s in zip(items, slow) if s == (tier == 'slow')]


# The quick tier starts no process, however a test starts one (test_tiers.py reads the source for
# the same; this sees what runs, inductor's compiler included): Python's audit events for it
PROCESS_EVENTS = {'subprocess.Popen', 'os.system', 'os.fork', 'os.forkpty', 'os.posix_spawn',
                  'os.exec', 'os.spawn'}
# platform.processor(), a GPU's name where present, the pool of compile workers that torch 2.4
# starts at its first torch.compile (later versions compile in this process), and the font list
# that matplotlib reads once to build its font cache (a new machine's first plot)
HARMLESS_PROGRAMS = {'uname', 'nvidia-smi', 'inductor compile worker', 'fc-list'}
STARTED_PROCESSES = []  # (event, program) of every process started in this pytest process


def record_process_start(event, args):
    """The audit hook: the program of each process started (its first word; '' for a fork)."""
    if event not in PROCESS_EVENTS:
        return
    command = args[1] if event in ('subprocess.Popen', 'os.spawn') else args[0] if args else ''
    if isinstance(command, str):
        command = command.split()
    elif isinstance(command, (bytes, os.PathLike)):
        command = [command]
    words = [os.fsdecode(word) for word in command] if isinstance(command, (list, tuple)) else []
    program = 'inductor compile worker' if any('compile_worker' in w for w in words) else \
        os.path.basename(words[0]) if words else ''
    STARTED_PROCESSES.append((event, program))


sys.addaudithook(record_process_start)


def unexpected_processes(started):
    return [(event, program) for event, program in started if program not in HARMLESS_PROGRAMS]


@pytest.fixture(autouse=True)
def quick_tests_start_no_process(request):
    """A test not marked slow that starts a process (but the harmless ones) fails."""
    before = len(STARTED_PROCESSES)
    yield
    started = unexpected_processes(STARTED_PROCESSES[before:])
    if started and request.node.get_closest_marker('slow') is None:
        pytest.fail(f'a test not marked slow started processes: {started}; mark it '
                    '@pytest.mark.slow (docs/tests.md, "Tiers")')


@pytest.fixture(autouse=True)
def no_heartbeat_left_running():
    """A study run in this process stops its heartbeat however it ends: one left running aborts
    the interpreter at exit, after every test passed (studylib.distribute.Heartbeat)."""
    yield
    from studylib.distribute import Heartbeat
    running = [thread for thread in threading.enumerate() if isinstance(thread, Heartbeat)]
    if running:
        pytest.fail(f'{len(running)} study heartbeat thread(s) still running after the test')


def newton_schulz_by_svd(coefficients, matrix, steps):
    """The quintic Newton-Schulz iteration computed on the singular values alone, in float64:
    U p(S / |M|_F) V^T, with p(s) = a s + b s^3 + c s^5 applied `steps` times. Independent of the
    code under test."""
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    a, b, c = coefficients
    s = s / s.square().sum().sqrt()
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return u @ torch.diag(s) @ vh

# The paper's four scripts share the optimizer (SGD with Lookahead); airbench94_muon replaces it
PAPER_SCRIPTS = ['airbench94', 'airbench94_compiled', 'airbench95', 'airbench96']
SCRIPTS = [*PAPER_SCRIPTS, 'airbench94_muon', 'airbench94_hiverge']
# airbench96_faster trains slowly at full width: the tests over ALL_SCRIPTS give it small widths
ALL_SCRIPTS = [*SCRIPTS, 'airbench96_faster']
CPU = torch.device('cpu')
# With its index: for a bare 'cuda', torch 2.4's Tensor.to asks the CUDA runtime for the current
# device, which fails on a machine without a GPU driver (later versions answer without asking)
FAKE_CUDA = torch.device('cuda', 0)


def fake_cuda_indexes():
    """Whether a fake CUDA tensor can be indexed here. Torch 2.4's indexing sets the tensor's
    CUDA device first, through the CUDA runtime, even for a fake one: without a GPU driver, it
    raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    try:
        with FakeTensorMode():
            torch.empty(2, 2, device=FAKE_CUDA)[:, 0]
    except RuntimeError:
        return False
    return True


def cpu_reflect_pads_fp16():
    """Whether the CPU reflect-pads fp16 images in the loader's layout (torch 2.4's cannot)."""
    images = torch.zeros(2, 4, 4, 3, dtype=torch.float16).permute(0, 3, 1, 2)
    try:
        torch.nn.functional.pad(images, (1,) * 4, mode='reflect')
    except RuntimeError:
        return False
    return True


# The checks that need them are skipped where this torch lacks them, saying why; on a GPU host, or
# a later torch, they run (docs/tests.md, "Torch versions")
needs_fake_cuda = pytest.mark.skipif(not fake_cuda_indexes(), reason=(
    f'torch {torch.__version__} indexes a fake CUDA tensor through the CUDA runtime, and this '
    'machine has no GPU driver'))
needs_cpu_fp16_padding = pytest.mark.skipif(not cpu_reflect_pads_fp16(), reason=(
    f"torch {torch.__version__}'s CPU kernels do not reflect-pad fp16 images, which the fp16 "
    'recipe runs on the CPU here'))

# The scripts take no --hyp (study.py does, after its --): a test runs a script on a schedule of its
# own as a user who edited hyp does, with entries set ('GROUP.NAME': value) on the module
# (set_hyp, for main() in this process) or in the script's process (run_script's hyp). Checks of
# training, not of accuracy, train tools/gpu_check.py's tiny networks (TINY_WIDTHS, tiny_hyp).
# A quick schedule on the synthetic image folder: 384 training images in batches of 64, 4 epochs
QUICK_HYP = {'opt.batch_size': 64}
QUICK = ['--epochs', '4', '--device', 'cpu']
# The quickest complete run of airbench94: one epoch of batches of 32 of a tiny network, no TTA
TINY_HYP = {**tiny_hyp('airbench94'), 'net.tta_level': 0}
TINY = ['--epochs', '1', '--device', 'cpu']


def in_fp32(monkeypatch, script):
    """Make the script's main() train in fp32 on any CPU (its precision_for picks bf16 autocast
    where the CPU has native bf16): for checks whose tolerances or graphs are fp32's."""
    monkeypatch.setattr(script, 'precision_for', lambda device: 'fp32')


def set_hyp(monkeypatch, script, *settings):
    """Make the script's main() run with these hyp entries (dicts of 'GROUP.NAME': value, a later
    one winning), as after an edit of its hyp; restored after the test."""
    merged = {key: value for entries in settings for key, value in entries.items()}
    monkeypatch.setattr(script, 'hyp', with_entries(script.hyp, merged))


@pytest.fixture(params=SCRIPTS)
def script(request):
    return load_script(request.param)


@pytest.fixture(params=PAPER_SCRIPTS)
def paper_script(request):
    return load_script(request.param)


@pytest.fixture
def ab94():
    return load_script('airbench94')


def quick_train(script, data, seed=0, net=None, entries=None):
    """train() on a small dataset: a network of TINY_WIDTHS, batches of 32 and 4 epochs unless
    entries ({'GROUP.NAME': value}) say otherwise."""
    hyp = with_entries(script.hyp, {'opt.batch_size': 32, 'opt.train_epochs': 4,
                                    'net.widths': TINY_WIDTHS, **(entries or {})})
    return script.train(data, hyp, CPU, 'fp32', seed, net=net, epoch_eval=False)


def write_image_folder(root, num_classes=4, train_per_class=96, test_per_class=32, size=32, seed=0,
                       extension='.png'):
    """An easy synthetic dataset in the image-folder layout: each class has its own mean colour and
    a class-specific stripe, plus noise, so a network can learn it in a few steps."""
    from PIL import Image
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(num_classes, 3, generator=generator) * 160 + 48
    for split, per_class in (('train', train_per_class), ('test', test_per_class)):
        for label in range(num_classes):
            class_dir = os.path.join(root, split, f'class_{label}')
            os.makedirs(class_dir, exist_ok=True)
            for i in range(per_class):
                image = colours[label].view(1, 1, 3) + 40 * torch.randn(size, size, 3, generator=generator)
                stripe = (label * size) // num_classes
                image[:, stripe:stripe + 3] = 255 - image[:, stripe:stripe + 3]
                pixels = image.clamp(0, 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(os.path.join(class_dir, f'{i:04d}{extension}'))
    return root


@pytest.fixture
def image_folder(tmp_path):
    return write_image_folder(str(tmp_path / 'data'))


def tiny_dataset(num_classes=2, per_class=32):
    """An in-memory dataset (the same images for train and test) that a network separates at once:
    class c has pixel values 200c + noise."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    images = (labels.view(-1, 1, 1, 1) * 200 + torch.randint(0, 50, (len(labels), 32, 32, 3),
                                                           generator=generator)).to(torch.uint8)
    split = {'images': images, 'labels': labels}
    return {'train': split, 'test': split, 'classes': [str(c) for c in range(num_classes)],
            'mean': (0.5,) * 3, 'std': (0.25,) * 3}


def compile_with_backend(monkeypatch, backend):
    """Make torch.compile, as the scripts call it, use this backend (their mode dropped: it would
    pick inductor's options)."""
    compile_function = torch.compile
    monkeypatch.setattr(torch, 'compile', lambda model, mode=None, **kwargs:
                        compile_function(model, backend=backend, **kwargs))


def record_compiled_graphs(monkeypatch):
    """Make torch.compile record every graph it compiles (the shapes of its tensor inputs: the
    parameters, where a torch version passes them, and the data) and run it eagerly."""
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return graph_module.forward

    compile_with_backend(monkeypatch, recording_backend)
    return graphs


def warm_up_as_on_cuda(monkeypatch, script, graphs):
    """Make main()'s warmup the full one it runs on CUDA, whatever the device; returns a list that
    receives len(graphs) when the warmup ends: the graphs compiled before any timed run."""
    warmed = []
    warm_up = script.warm_up

    def full_warm_up(*args, full):
        warm_up(*args, full=True)
        warmed.append(len(graphs))
    monkeypatch.setattr(script, 'warm_up', full_warm_up)
    return warmed


def script_command(name, *args, hyp=None):
    """The command line of a script run as a user runs it; with hyp ({'GROUP.NAME': value}), as a
    user who edited those entries of hyp runs it."""
    path = os.path.join(REPO, f'{name}.py')
    if not hyp:
        return [sys.executable, path, *args]
    return [sys.executable, '-c', MAIN_WITH_HYP, path, json.dumps(hyp), *args]


def run_script(name, *args, hyp=None, timeout=600):
    return subprocess.run(script_command(name, *args, hyp=hyp), capture_output=True, text=True,
                          timeout=timeout)


def study_dir(log_dir):
    """The one study directory a run of a script made under log_dir."""
    (directory,) = list(log_dir.iterdir())
    return directory


def summary_of(log_dir):
    return json.loads((study_dir(log_dir) / 'summary.json').read_text())


def free_port():
    """A TCP port free on localhost now (for a torchrun rendezvous)."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def torchrun(*launcher_flags):
    """The command line of torchrun with these flags, as `python -m torch.distributed.run`."""
    return [sys.executable, '-m', 'torch.distributed.run', *launcher_flags]


def descendants(pid):
    """The ids of pid's children, their children, and so on (from /proc)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parent = int(f.read().rpartition(')')[2].split()[1])
        except (OSError, ValueError, IndexError):  # the process has ended meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    found = []
    frontier = [pid]
    while frontier:
        offspring = children.get(frontier.pop(), [])
        found += offspring
        frontier += offspring
    return found


def torchrun_worker(launcher_pid, rank):
    """The id of the worker process of this rank that torchrun (launcher_pid) started, or None."""
    for pid in descendants(launcher_pid):
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                environment = dict(item.partition(b'=')[::2] for item in f.read().split(b'\0'))
        except OSError:
            continue
        if environment.get(b'RANK') == str(rank).encode():
            return pid
    return None


def script_changes(name):
    """docs/layout.md's section on what NAME.py changes relative to its parent: the text from its
    heading, '### NAME.py (from PARENT.py)', to the next heading."""
    import re
    with open(os.path.join(REPO, 'docs', 'layout.md')) as f:
        text = f.read()
    section = re.search(rf'^### {re.escape(name)}\.py \(from \w+\.py\)\n(.*?)(?=^#|\Z)', text,
                        re.MULTILINE | re.DOTALL)
    assert section, f'docs/layout.md has no section on what {name}.py changes'
    return section.group(1)
