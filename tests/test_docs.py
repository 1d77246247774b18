"""The documentation points only at what exists: every relative link (and its #anchor) and every
repository path named in README.md and docs/, nothing outside the repository, and README's install
and test commands are the ones CI runs."""
import glob
import os
import re
import sys

import pytest

from conftest import REPO, load_script, tiny_hyp, with_entries

DOCUMENTS = ['README.md', 'CHANGELOG.md', 'tools/README.md', *sorted(
    os.path.relpath(path, REPO) for path in glob.glob(os.path.join(REPO, 'docs', '*.md')))]
LINK = re.compile(r'\]\(([^)\s]+)\)')
CODE = re.compile(r'`([^`\s]+)`')


def read(document):
    with open(os.path.join(REPO, document)) as f:
        return f.read()


def anchors(document):
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces
    to hyphens."""
    headings = re.findall(r'^#+ (.+)$', read(document), re.MULTILINE)
    return {re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
            for heading in headings}


def ignored_directories():
    """The top-level directories that .gitignore keeps out of the repository (data/, logs/): what
    the scripts make there is a user's, not the repository's."""
    lines = read('.gitignore').splitlines()
    return {line.strip().rstrip('/') for line in lines if re.fullmatch(r'[\w.-]+/', line.strip())}


def named_paths(text):
    """Repository paths named in code spans: a .py file, or a path under a top-level directory of
    the repository, one that is not ignored (placeholders in capitals such as DIR/ and LOG_DIR/
    are not paths; data/DATASET is the data's place, not a path of the repository, even once
    README's commands have made data/cifar10)."""
    top_level = {name for name in os.listdir(REPO) if os.path.isdir(os.path.join(REPO, name))
                 and not name.startswith('.git')} - ignored_directories()
    for token in CODE.findall(text):
        token = token.rstrip('.,:;')
        first = token.split('/')[0]
        if re.fullmatch(r'\w+\.py', token):
            yield token
        elif '/' in token and first in top_level and '*' not in token and '<' not in token:
            yield token


@pytest.mark.parametrize('document', DOCUMENTS)
def test_relative_links_and_anchors_exist(document):
    for target in LINK.findall(read(document)):
        if re.match(r'[a-z]+://', target):
            continue
        path, _, anchor = target.partition('#')
        resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(document), path)) \
            if path else os.path.join(REPO, document)
        assert os.path.exists(resolved), f'{document}: link to {target}, which does not exist'
        if anchor:
            assert anchor in anchors(os.path.relpath(resolved, REPO)), \
                f'{document}: link to {target}, a heading that does not exist'


def missing_paths(document):
    """The repository paths that document names and the repository lacks."""
    missing = []
    for path in named_paths(read(document)):
        if '/' in path:
            found = os.path.exists(os.path.join(REPO, path))
        else:  # a file name alone: a script at the top, or a file of tests/ or tools/
            found = glob.glob(os.path.join(REPO, '**', path), recursive=True)
        if not found:
            missing.append(path)
    return missing


@pytest.mark.parametrize('document', DOCUMENTS)
def test_named_repository_paths_exist(document):
    assert missing_paths(document) == [], f'{document} names paths the repository lacks'


@pytest.fixture
def data_made_by_readmes_commands():
    """REPO/data/cifar10, as README's CPU command leaves it (torchvision makes it even when the
    download fails); removed after the test where the test made it."""
    made = [path for path in (os.path.join(REPO, 'data'), os.path.join(REPO, 'data', 'cifar10'))
            if not os.path.exists(path)]
    for path in made:
        os.mkdir(path)
    yield
    for path in reversed(made):
        os.rmdir(path)


def test_the_docs_check_passes_after_readmes_commands(data_made_by_readmes_commands):
    """README's commands in their order (the install, the CPU run, the tests) leave the suite
    passing: data/ is the user's (ignored), and docs/studies.md's data/DATASET is no path of the
    repository; a path under a directory of the repository is still checked."""
    assert 'data' in ignored_directories() and 'logs' in ignored_directories()
    assert [document for document in DOCUMENTS if missing_paths(document)] == []
    assert list(named_paths('`data/DATASET` `docs/nothing.md` `tools/gpu_check.py`')) == \
        ['docs/nothing.md', 'tools/gpu_check.py']


@pytest.mark.parametrize('document', DOCUMENTS)
def test_no_path_outside_the_repository(document):
    text = read(document)
    for target in LINK.findall(text):  # a link up from docs/ or tools/ into the repository
        resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(document), target))
        if resolved.startswith(REPO + os.sep):
            text = text.replace(f']({target})', ']()')
    assert not re.search(r'\.\./|/work/|/tmp/', text), \
        f'{document} names a path outside the repository'


def test_every_tool_has_its_line_in_the_tools_readme():
    listed = set(re.findall(r'^\| `([\w.]+)` \|', read('tools/README.md'), re.MULTILINE))
    tools = {name for name in os.listdir(os.path.join(REPO, 'tools'))
             if name.endswith(('.py', '.sh'))}
    assert listed == tools


def test_readme_install_and_test_commands_are_what_ci_runs():
    readme = read('README.md')
    ci = read('.ci/run').splitlines()
    commands = [line.strip() for line in readme.splitlines() if line.startswith('    ')]
    install = [c for c in commands if c.startswith('pip install')]
    test = [c for c in commands if c.startswith('python -m pytest')]
    assert install and test
    for command in {*install, *(c.partition('#')[0].strip() for c in test)}:
        assert command in ci, f'README says {command!r}; .ci/run does not run it'


def readme_block(heading):
    """The first indented block of README.md after the heading: its lines, unindented."""
    after = read('README.md').partition(f'\n## {heading}\n')[2]
    lines = after.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('    '))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith('    ')),
               len(lines))
    return [line[4:] for line in lines[start:end]]


def test_readmes_example_from_ones_own_code_runs(image_folder, monkeypatch, capsys):
    """As written, but on the tests' image folder and airbench94's tiny network: it trains and
    prints the run's TTA accuracy (4 classes: chance is 0.25) and its timed seconds."""
    code = '\n'.join(readme_block('From your own code'))
    assert "load_dataset('data/cifar10')" in code
    script = load_script('airbench94')
    monkeypatch.setattr(script, 'hyp', with_entries(script.hyp, tiny_hyp('airbench94')))
    monkeypatch.setitem(sys.modules, 'airbench94', script)
    exec(code.replace("'data/cifar10'", repr(image_folder)), {})
    accuracy, seconds = map(float, capsys.readouterr().out.split())
    assert accuracy > 0.6 and seconds > 0


def test_every_figure_of_readmes_results_is_in_docs_gpu_with_its_date_and_commit():
    """Each measured row of README's results table has a row in docs/gpu.md's table of the newest
    measurements naming the same script, date and commit and holding every figure of it."""
    rows = re.findall(r'^\| `(airbench\w+)\.py` \|.*\| (\d{4}-\d\d-\d\d), (\w{7}), (.*) \|$',
                      read('README.md'), re.MULTILINE)
    assert len(rows) == 5
    gpu_rows = [line for line in read('docs/gpu.md').splitlines() if line.startswith('| ')]
    for script, date, commit, figures in rows:
        numbers = re.findall(r'\d+\.\d+%?(?: s)?', figures)
        assert numbers, figures
        assert any(all(text in line for text in [script, date, commit, *numbers])
                   for line in gpu_rows), f'{script}: {date}, {commit}, {numbers}'
