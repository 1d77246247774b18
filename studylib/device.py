"""A study's device: the device and precision its flags name, how this process sets it up, what
torch.compile has compiled on it, and where the runs happen (each process's host, device model and
versions, and a launch's as a whole)."""
import contextlib
import ctypes
import logging
import os
import platform
import socket
import subprocess
import sys

import torch

from .errors import StudyError
from .scripts import repository_tail


def resolve_device_precision(device_name, precision, local_rank=0):
    """(torch.device, precision) for --device and --precision, auto as the scripts' tail chooses
    (CUDA where present; fp16 on CUDA, bf16 on a CPU with native bf16, else fp32). A CUDA device
    always carries its index (cuda_device)."""
    tail = repository_tail()
    try:
        device = tail.resolve_device(None if device_name == 'auto' else device_name)
    except ValueError as error:
        raise StudyError(str(error)) from None
    except RuntimeError:
        raise StudyError(f'--device {device_name!r} is not a device; use auto, cpu, cuda or '
                         'cuda:N') from None
    if device.type == 'cuda':
        device = cuda_device(device, local_rank)
    if precision == 'auto':
        precision = tail.precision_for(device)
    return device, precision


def cuda_device(device, local_rank):
    """The GPU of this process, with its index (torch.cuda.set_device refuses a bare 'cuda'):
    cuda:N is GPU N for every process of the machine (several processes may share it); cuda, the
    GPU of the process's local rank (one GPU per process, as torchrun's --nproc_per_node)."""
    count = torch.cuda.device_count()
    index = local_rank if device.index is None else device.index
    if index < count:
        return torch.device('cuda', index)
    if device.index is None:
        raise StudyError(f'{count} GPUs on {socket.gethostname()}, fewer than the processes '
                         'torchrun started there (--nproc_per_node); or give --device cuda:0 to '
                         'run them all on one GPU')
    raise StudyError(f'--device {device}: {socket.gethostname()} has {count} GPU'
                     f'{"s" if count > 1 else ""}, cuda:0 to cuda:{count - 1}')


def keep_freed_memory_in_process():
    """Make glibc's malloc keep freed memory: by default each CPU training step would page-fault
    and zero-fill its large activations anew (docs/cpu.md, "Speed"). False without glibc."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt  # both exist only in glibc
        _ = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
    M_MMAP_MAX = -4
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def prepare_device(device, deterministic):
    """cuDNN's autotuner on unless runs must repeat bitwise; the allocator kept from returning
    memory (for the CPU's steps; harmless beside a GPU)."""
    if device.type == 'cuda':
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = not deterministic
    if deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    keep_freed_memory_in_process()


def compile_counts():
    """(graphs dynamo traced, inductor compiled anew, inductor loaded from its FX graph cache) in
    this process so far: the one count of compiled graphs (records, tools, tests)."""
    dynamo_utils = sys.modules.get('torch._dynamo.utils')
    if dynamo_utils is None:
        return 0, 0, 0
    inductor = dynamo_utils.counters['inductor']
    compiled = inductor['fxgraph_cache_miss'] + inductor['fxgraph_cache_bypass']
    return dynamo_utils.counters['stats']['unique_graphs'], compiled, inductor['fxgraph_cache_hit']


class RecompileLimitHits(logging.Handler):
    """The warnings in which torch.compile says that it hit its recompile limit (every torch
    version says it so): past it, dynamo runs each new variant of the function eagerly."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith('torch._dynamo hit config.'):
            self.hits.append(message.splitlines()[0])


@contextlib.contextmanager
def recompile_limits(num_configs):
    """torch.compile's recompile limit, for a process that holds several configurations' networks.

    The limit (8 variants of a function) is per code object, and compiled networks share one:
    torch.compile(net.forward) compiles torch's wrapper of nn.Sequential's forward for every
    network. So each configuration gets its script's own limit (the limit times the
    configurations); a hit raises where torch can (2.5 on) and is noted (yields the
    RecompileLimitHits): a run is never timed eagerly where its script alone compiles."""
    import torch._dynamo  # noqa: F401  (its config; a study compiles, or its scripts may)
    config = torch._dynamo.config
    limits = dict(cache_size_limit=config.cache_size_limit * num_configs,
                  accumulated_cache_size_limit=config.accumulated_cache_size_limit * num_configs)
    if hasattr(config, 'fail_on_cache_limit_hit'):
        limits['fail_on_cache_limit_hit'] = True
    watch = RecompileLimitHits()
    logger = logging.getLogger('torch._dynamo')
    logger.addHandler(watch)
    try:
        with config.patch(**limits):
            yield watch
    finally:
        logger.removeHandler(watch)


def cpu_model():
    if platform.processor() not in ('', platform.machine()):
        return platform.processor()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.partition(':')[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver():
    try:
        query = ['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader']
        output = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split()
        return output[0] if output else None
    except (OSError, subprocess.SubprocessError):
        return None


def device_model(device):
    return torch.cuda.get_device_name(device) if device.type == 'cuda' else cpu_model()


def local_environment(device, precision):
    info = dict(host=socket.gethostname(), cpu=cpu_model(), torch=torch.__version__,
                python=platform.python_version(), device=device.type, precision=precision,
                device_model=device_model(device))
    if device.type == 'cuda':
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    driver=nvidia_driver())
    return info


def world_environment(infos):
    def values(key):
        found = sorted({str(info[key]) for info in infos if info.get(key) is not None})
        return ', '.join(found) or None

    gpus = {}
    for info in infos:
        if info.get('gpu'):
            gpus[info['gpu']] = gpus.get(info['gpu'], 0) + 1
    return dict(world_size=len(infos), hosts=values('host'), gpus=gpus or None,
                gpu_count=sum(gpus.values()), driver=values('driver'), cuda=values('cuda'),
                torch=values('torch'), cpu=values('cpu'), python=values('python'),
                device=values('device'), precision=values('precision'))
