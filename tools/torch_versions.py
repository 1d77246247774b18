"""The scripts on every tested torch: one virtual environment per file of .ci/versions/ (its exact
versions, with requirements.txt), the scripts' tests run there (both tiers: the graphs each compiled
script compiles, in its warmup and none when timed, are their tests'), and one table: torch,
torchvision, tests passed, failed and skipped, seconds.

A survey, not a test: it prints figures (docs/tests.md, "Torch versions", holds them) and exits
with 1 when a test failed, so CI can run it too.

Usage: python tools/torch_versions.py [--versions oldest,current,...] [--venvs DIR]
                                      [--tests scripts|all|test_x,tests/scripts/test_y.py,...]
The environments go to --venvs (default ~/.cache/airbench/venvs, outside the repository) and are
reused: pip installs only what changed. A first install downloads torch and its CUDA libraries
(about 2.5 to 4 GB per version); pip's cache makes the next ones quick.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS_DIR = os.path.join(REPO, '.ci', 'versions')
# The tests of the scripts (method, CUDA path, compilation, switches, errors, data, end to end);
# the others test study.py and the tools
SCRIPT_TESTS = ['test_method', 'test_cuda_path', 'test_compiled', 'test_muon', 'test_faster',
                'test_hiverge', 'test_switches', 'test_errors', 'test_datasets', 'test_end_to_end']


def pins(name):
    """{package: version} of .ci/versions/<name>.txt."""
    with open(os.path.join(VERSIONS_DIR, f'{name}.txt')) as f:
        return dict(re.match(r'([\w.-]+)==(\S+)', line).groups() for line in f
                    if line.strip() and not line.startswith('#'))


def version_names():
    """The files of .ci/versions/, oldest torch first."""
    names = [file[:-4] for file in os.listdir(VERSIONS_DIR) if file.endswith('.txt')]
    return sorted(names, key=lambda name: tuple(map(int, pins(name)['torch'].split('.'))))


def pip_environment():
    """os.environ without PIP_CONSTRAINT (CI sets it to current.txt), so that each environment gets
    its own file's versions."""
    return {key: value for key, value in os.environ.items() if key != 'PIP_CONSTRAINT'}


def prepare(name, venvs):
    """The Python of a virtual environment with .ci/versions/<name>.txt's versions installed."""
    venv = os.path.join(venvs, f"torch-{pins(name)['torch']}")
    python = os.path.join(venv, 'bin', 'python')
    if not os.path.exists(python):
        subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
    requirements = os.path.join(REPO, 'requirements.txt')
    constraints = os.path.join(VERSIONS_DIR, f'{name}.txt')
    subprocess.run([python, '-m', 'pip', 'install', '-q', '-r', requirements, 'pytest', '-c',
                    constraints], check=True, env=pip_environment())
    return python


def test_files(selection):
    if selection == 'all':
        return ['tests']
    names = SCRIPT_TESTS if selection == 'scripts' else selection.split(',')
    found = {os.path.basename(path)[:-3]: os.path.relpath(path, REPO) for path in
             glob.glob(os.path.join(REPO, 'tests', '**', 'test_*.py'), recursive=True)}
    paths = [name if name.endswith('.py') else found.get(name, '') for name in names]
    return [path for path in paths if path and os.path.exists(os.path.join(REPO, path))]


def run_tests(python, files):
    """{'passed', 'failed', 'skipped', 'seconds', 'failures': [test ids], 'seconds_per_file'}, from
    pytest's report."""
    with tempfile.TemporaryDirectory() as directory:
        report = os.path.join(directory, 'report.xml')
        start = time.perf_counter()
        subprocess.run([python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--tier', 'all',
                        *files, f'--junitxml={report}'], cwd=REPO)
        seconds = time.perf_counter() - start
        cases = ElementTree.parse(report).getroot().iter('testcase')
        outcomes = {}
        seconds_per_file = {}
        for case in cases:
            test = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            outcomes[test] = ('failed' if kinds & {'failure', 'error'} else
                              'skipped' if 'skipped' in kinds else 'passed')
            file = next(part for part in case.get('classname').split('.')
                        if part.startswith('test_'))
            seconds_per_file[file] = seconds_per_file.get(file, 0) + float(case.get('time', 0))
    counts = {kind: sum(outcome == kind for outcome in outcomes.values())
              for kind in ('passed', 'failed', 'skipped')}
    failures = [test for test, outcome in outcomes.items() if outcome == 'failed']
    return dict(counts, seconds=seconds, failures=failures,
                seconds_per_file={file: round(s, 1) for file, s in seconds_per_file.items()})


def table(rows):
    header = ['torch', 'torchvision', 'file', 'passed', 'failed', 'skipped', 'seconds']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for row in rows:
        tests = row['tests']
        lines.append('| ' + ' | '.join(map(str, [
            row['torch'], row['torchvision'], f"{row['name']}.txt", tests['passed'],
            tests['failed'], tests['skipped'], f"{tests['seconds']:.0f}"])) + ' |')
    return '\n'.join(lines)


def survey(names, venvs, selection):
    rows = []
    for name in names:
        python = prepare(name, venvs)
        report = 'import torch, torchvision as tv; print(torch.__version__, tv.__version__)'
        versions = subprocess.run([python, '-c', report], capture_output=True, text=True,
                                  check=True).stdout.split()
        row = dict(name=name, torch=versions[0], torchvision=versions[1],
                   tests=run_tests(python, test_files(selection)))
        print(f"{name}: {json.dumps(row)}", flush=True)
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--versions', default=','.join(version_names()),
                        help='files of .ci/versions/ (without .txt), comma-separated')
    parser.add_argument('--venvs', default=os.path.expanduser('~/.cache/airbench/venvs'),
                        help='where the virtual environments go (one per torch version)')
    parser.add_argument('--tests', default='scripts', help="'scripts' (the scripts' test files: "
                        f"{', '.join(SCRIPT_TESTS)}), 'all', or test files, comma-separated")
    args = parser.parse_args()
    rows = survey(args.versions.split(','), args.venvs, args.tests)
    print(table(rows))
    failures = [(row['torch'], test) for row in rows for test in row['tests']['failures']]
    for torch_version, test in failures:
        print(f'failed on torch {torch_version}: {test}')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
