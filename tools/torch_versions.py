"""The scripts on every tested torch: one virtual environment per file of .ci/versions/ (its exact
versions, with requirements.txt), the scripts' tests run there, and one table: torch, torchvision,
tests passed, failed and skipped, and the graphs each compiled script compiles in its warmup and in
a timed run after it.

A survey, not a test: it prints figures (docs/tests.md, "Torch versions", holds them) and exits
with 1 when a test failed or a script compiled in a timed run, so CI can run it too.

The graphs are counted in each environment by this file itself (--count-graphs SCRIPT, a process
per script): the script's train() runs once on studylib's warmup data (dummy_dataset) and once on a
small synthetic dataset, as study.py's warmup then a timed run, torch.compile's graphs captured by
dynamo as on any device and run eagerly (the 'eager' backend generates nothing; the
count is dynamo's). Where a script compiles on CUDA only, decided by its compiles(device) (as
airbench94_muon), that decision is forced here, so its CUDA graphs are counted; a script that
compiles nothing here is shown as such. airbench96_faster compiles nothing anywhere.

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
COMPILED_SCRIPTS = ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']


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
    requirements, constraints = (os.path.join(REPO, 'requirements.txt'),
                                 os.path.join(VERSIONS_DIR, f'{name}.txt'))
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
        outcomes, seconds_per_file = {}, {}
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


def count_graphs(python):
    """{script: [graphs compiled in the warmup, in the timed run], or None where it compiles on
    CUDA only, or 'error'} in that environment, each script in a process of its own."""
    counts = {}
    for name in COMPILED_SCRIPTS:
        if os.path.exists(os.path.join(REPO, f'{name}.py')):
            result = subprocess.run([python, os.path.abspath(__file__), '--count-graphs', name],
                                    cwd=REPO, capture_output=True, text=True)
            counts[name] = (json.loads(result.stdout.strip().splitlines()[-1])
                            if result.returncode == 0 else 'error')
    return counts


# ----------------------------- Inside an environment: --count-graphs ------------------------------
def synthetic_dataset(train, test):
    """Images of two classes a network separates at once (class c: pixels about 200 c)."""
    import torch
    generator = torch.Generator().manual_seed(0)

    def split(n):
        labels = torch.arange(n) % 2
        noise = torch.randint(0, 50, (n, 32, 32, 3), generator=generator)
        images = (labels.view(-1, 1, 1, 1) * 200 + noise).to(torch.uint8)
        return {'images': images, 'labels': labels}
    return {'train': split(train), 'test': split(test), 'classes': ['0', '1'],
            'mean': (0.5,) * 3, 'std': (0.25,) * 3}


def warmup_and_run_graphs(name):
    """[graphs compiled in the warmup, in the timed run] as a study trains the script: a warmup on
    studylib's dummy data, then a run on the synthetic data; 2 batches of 32 per epoch, 4 epochs
    (across the whitening-bias freeze), 200 test images (one evaluation batch size, as CIFAR-10's
    10,000 in batches of 2000)."""
    import copy
    import importlib.util
    import torch
    sys.path.insert(0, REPO)
    from studylib.data import dummy_dataset
    from studylib.device import compiled_graph_count
    torch._dynamo.reset()
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, f'{name}.py'))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    compile_function = torch.compile
    torch.compile = lambda model, mode=None, **kwargs: compile_function(model, backend='eager',
                                                                        **kwargs)
    if hasattr(script, 'compiles'):  # compiled on CUDA only: the CUDA path's decision
        script.compiles = lambda device: True
    hyp, cpu = copy.deepcopy(script.hyp), torch.device('cpu')
    hyp['opt'].update(batch_size=32, train_epochs=4)
    data, net = synthetic_dataset(64, 200), script.build_net(hyp['net'], 2, cpu, 'fp32')
    counts = []
    for run_data in (dummy_dataset(script.infer, 2, 32, 200, cpu), data):
        before = compiled_graph_count()
        script.train(run_data, hyp, cpu, 'fp32', 0, net)
        counts.append(compiled_graph_count() - before)
    return counts if counts != [0, 0] or hasattr(script, 'compiles') else None  # None: CUDA only


# -------------------------------------------- The table -------------------------------------------
def describe_graphs(counts):
    if counts is None:
        return 'not compiled on the CPU'
    return counts if isinstance(counts, str) else ', '.join(map(str, counts))


def table(rows):
    scripts = [name for name in COMPILED_SCRIPTS if any(name in row['graphs'] for row in rows)]
    header = ['torch', 'torchvision', 'file', 'passed', 'failed', 'skipped', 'seconds',
              *[f'{name} graphs (warmup, timed)' for name in scripts]]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for row in rows:
        graphs = [describe_graphs(row['graphs'].get(name, 'error')) for name in scripts]
        tests = row['tests']
        lines.append('| ' + ' | '.join(map(str, [
            row['torch'], row['torchvision'], f"{row['name']}.txt", tests['passed'],
            tests['failed'], tests['skipped'], f"{tests['seconds']:.0f}", *graphs])) + ' |')
    return '\n'.join(lines)


def survey(names, venvs, selection):
    rows = []
    for name in names:
        python = prepare(name, venvs)
        report = 'import torch, torchvision as tv; print(torch.__version__, tv.__version__)'
        versions = subprocess.run([python, '-c', report], capture_output=True, text=True,
                                  check=True).stdout.split()
        row = dict(name=name, torch=versions[0], torchvision=versions[1],
                   tests=run_tests(python, test_files(selection)), graphs=count_graphs(python))
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
    parser.add_argument('--count-graphs', metavar='SCRIPT', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_graphs:
        return print(json.dumps(warmup_and_run_graphs(args.count_graphs)))
    rows = survey(args.versions.split(','), args.venvs, args.tests)
    print(table(rows))
    for row in rows:
        for test in row['tests']['failures']:
            print(f"failed on torch {row['torch']}: {test}")
    graphs = [row['graphs'] for row in rows]
    same = all(len({json.dumps(counts.get(name)) for counts in graphs}) == 1
               for name in graphs[0])
    timed_none = all(counts is None or counts != 'error' and counts[1] == 0
                     for row_graphs in graphs for counts in row_graphs.values())
    failed = any(row['tests']['failed'] for row in rows)
    if not same:
        print('The compiled graphs differ between versions.')
    return 0 if same and timed_none and not failed else 1


if __name__ == '__main__':
    sys.exit(main())
