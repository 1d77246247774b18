"""The supported range and the versions tested agree: requirements.txt states ranges, the files of
.ci/versions/ pin what tools/torch_versions.py and CI test; each file's pins lie in the ranges, and
the oldest file's are their lower bounds (so the bottom of the range is what is tested)."""
import os
import sys

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'tools'))
import torch_versions  # noqa: E402  (tools/ is not a package)


def requirements():
    with open(os.path.join(REPO, 'requirements.txt')) as f:
        lines = [line.strip() for line in f]
    return [Requirement(line) for line in lines if line and not line.startswith('#')]


def test_requirements_are_ranges_with_lower_bounds():
    for requirement in requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {'>='}, f'{requirement}: a lower bound, so a working install is kept'


@pytest.mark.parametrize('name', torch_versions.version_names())
def test_each_tested_set_lies_in_the_supported_range(name):
    pins = torch_versions.pins(name)
    assert {'torch', 'torchvision', 'pytest'} <= set(pins)
    for requirement in requirements():
        if requirement.name in pins:
            assert Version(pins[requirement.name]) in requirement.specifier, (name, requirement)


def test_the_oldest_set_is_the_ranges_lower_bounds():
    oldest = torch_versions.pins('oldest')
    for requirement in requirements():
        (bound,) = [Version(spec.version) for spec in requirement.specifier]
        pinned = Version(oldest[requirement.name])
        assert pinned.release[:len(bound.release)] == bound.release, requirement
    assert torch_versions.version_names()[0] == 'oldest'


def test_ci_pins_current_and_tests_oldest():
    with open(os.path.join(REPO, '.ci', 'run')) as f:
        ci = f.read()
    assert '.ci/versions/current.txt' in ci and 'tools/torch_versions.py --versions oldest' in ci
