"""GPUs for the engine's device path on a machine without one: torch._C's CUDA driver entry points
are stood in for, and nothing above them, so that torch.cuda's own Python (argument checks, lazy
initialization, the device count's cache and range checks) runs as on a GPU machine. It cannot
allocate: a tensor made on 'cuda' still asks the real runtime, and fails.

`with cuda_stand_in(monkeypatch, count=2) as driver:`; driver.current is the device last selected,
driver.calls every driver call, and driver.sticky_error (a message) fails every later call, as
after an illegal memory access."""
import contextlib
import types

import pytest
import torch

GPU_NAME = 'NVIDIA H100 80GB HBM3'


class CudaDriver:
    def __init__(self, count):
        self.count = count
        self.current = 0
        self.calls = []
        self.sticky_error = None

    def call(self, name, *args):
        self.calls.append((name, *args))
        if self.sticky_error is not None:
            raise RuntimeError(f'CUDA error: {self.sticky_error}')

    def get_device_count(self):
        self.calls.append(('getDeviceCount',))  # never raises: torch's answers 0 instead
        return self.count

    def init(self):
        """What torch._C._cuda_init leaves behind: a generator per GPU and the properties call."""
        self.call('init')
        torch.cuda.default_generators = tuple(torch.Generator() for _ in range(self.count))
        torch.cuda._get_device_properties = self.properties

    def set_device(self, index):
        self.call('setDevice', index)
        if not 0 <= index < self.count:
            raise RuntimeError('CUDA error: invalid device ordinal')
        self.current = index

    def get_device(self):
        self.call('getDevice')
        return self.current

    def properties(self, index):
        self.call('getDeviceProperties', index)
        return types.SimpleNamespace(name=GPU_NAME, major=9, minor=0, total_memory=80 * 2**30,
                                     multi_processor_count=132)

    def empty_cache(self):
        self.call('emptyCache')

    def synchronize(self):
        self.call('synchronize')


needs_cuda_build = pytest.mark.skipif(
    not hasattr(torch._C, '_cuda_getDeviceCount') or not hasattr(torch._C, '_cudart')
    or torch.cuda.is_available(), reason=(
        'the stand-in replaces the driver calls of a CUDA build of torch on a machine without a '
        f"GPU; this is torch {torch.__version__} "
        f"{'with a GPU' if torch.cuda.is_available() else 'without CUDA'}"))


@contextlib.contextmanager
def cuda_stand_in(monkeypatch, count=2):
    """Also torch.cuda's state of a process that has not touched CUDA yet (monkeypatch restores)."""
    driver = CudaDriver(count)
    entry_points = {'_cuda_getDeviceCount': driver.get_device_count, '_cuda_init': driver.init,
                    '_cuda_setDevice': driver.set_device, '_cuda_getDevice': driver.get_device,
                    '_cuda_emptyCache': driver.empty_cache,
                    '_cuda_synchronize': driver.synchronize}
    for name, function in entry_points.items():
        monkeypatch.setattr(torch._C, name, function)
    monkeypatch.setenv('PYTORCH_NVML_BASED_CUDA_CHECK', '0')
    for name, value in (('_initialized', False), ('_queued_calls', []),
                        ('_cached_device_count', None), ('default_generators', ())):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.cuda, '_get_device_properties', None, raising=False)
    yield driver
