"""Where runs happen: each process's host, device model and versions, and a launch's as a whole."""
import platform
import socket
import subprocess

import torch


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
    """The model of the device that times the runs: the GPU's name, or the CPU's."""
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
    """The launch's environment from every process's: GPU models with their counts, hosts, ..."""
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
