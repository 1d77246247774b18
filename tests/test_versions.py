"""requirements.txt states ranges; the files of .ci/versions/ pin what tools/torch_versions.py and
CI test: each within the ranges, the oldest at their lower bounds (the range's bottom tested)."""
import os

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO

import torch_versions


def requirements():
    with open(os.path.join(REPO, 'requirements.txt')) as f:
        lines = [line.strip() for line in f]
    return [Requirement(line) for line in lines if line and not line.startswith('#')]


def test_the_ranges_are_lower_bounds_and_the_oldest_set_pins_them():
    """Only lower bounds, so that installing the requirements keeps a working install."""
    oldest = torch_versions.pins('oldest')
    for requirement in requirements():
        (spec,) = requirement.specifier
        assert spec.operator == '>=', requirement
        bound = Version(spec.version)
        assert Version(oldest[requirement.name]).release[:len(bound.release)] == bound.release, \
            requirement
    assert torch_versions.version_names()[0] == 'oldest'


@pytest.mark.parametrize('name', torch_versions.version_names())
def test_each_tested_set_lies_in_the_supported_range(name):
    pins = torch_versions.pins(name)
    assert {'torch', 'torchvision', 'pytest'} <= set(pins)
    for requirement in requirements():
        if requirement.name in pins:
            assert Version(pins[requirement.name]) in requirement.specifier, (name, requirement)


def test_ci_pins_current_and_tests_oldest():
    with open(os.path.join(REPO, '.ci', 'run')) as f:
        ci = f.read()
    assert '.ci/versions/current.txt' in ci and 'tools/torch_versions.py --versions oldest' in ci
