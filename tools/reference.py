"""Run the published reference (../shared/tools/reference_airbench_cpu.py) in a chosen precision.

That tool runs the reference's forward passes under bf16 autocast. On CPUs without native bf16
(no AVX512-BF16 or AMX, such as AVX2-only AMD EPYC) bf16 convolutions are about 8x slower than
fp32, so there this wrapper disables the autocast (--precision fp32, the default where bf16 is not
native) and the reference is measured in the same precision our scripts choose. Nothing else of
the tool changes.

Usage: python tools/reference.py [--precision auto|fp32|bf16] [TOOL ARGS ...]
e.g.   python tools/reference.py --variant 94 --runs 1
"""
import argparse
import importlib.util
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, '..', 'shared', 'tools', 'reference_airbench_cpu.py')


def native_bf16():
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--precision', choices=['auto', 'fp32', 'bf16'], default='auto')
    args, tool_args = parser.parse_known_args()
    precision = args.precision if args.precision != 'auto' else ('bf16' if native_bf16() else 'fp32')

    spec = importlib.util.spec_from_file_location('reference_airbench_cpu', TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    if precision == 'fp32':
        autocast = torch.autocast
        torch.autocast = lambda device_type, **kwargs: autocast(device_type, enabled=False)
    print(f'reference precision: {precision}', flush=True)
    sys.argv = [TOOL, *tool_args]
    tool.main()


if __name__ == '__main__':
    main()
