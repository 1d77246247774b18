"""What the paper's experiments share: a command line, running their study with study.py (on one
device, or under torchrun on every GPU), and writing the paper-shaped table from its records.

Each experiment file gives its configurations (as study.py's --config and --grid flags) and a
function that turns the study's runs (study.load_study's table) into the table of the paper."""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import study  # noqa: E402


def parse(description, default_runs, argv, add_options=None):
    """The experiment's flags, and the flags after -- for the scripts (data, device, ...)."""
    argv = list(argv)
    split = argv.index('--') if '--' in argv else len(argv)
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--study-dir', required=True, help='where the study lives')
    parser.add_argument('--runs', type=int, default=default_runs, help="runs per configuration "
                        "(default: the paper's n)")
    parser.add_argument('--table-only', action='store_true', help='no training: the table from '
                        'the runs recorded so far')
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args(argv[:split])
    args.script_flags = argv[split + 1:]
    return args


def run(args, study_flags):
    """Train the study's missing runs (the same command continues it), then, on rank 0, return
    its runs as a table; None on the other processes, and on failure (study.py said why)."""
    if not args.table_only:
        status = study.main(['--runs', str(args.runs), '--study-dir', args.study_dir,
                             *study_flags, '--', *args.script_flags])
        if status != 0:
            sys.exit(status)
    if os.environ.get('RANK', '0') != '0':
        return None
    runs, arrays = study.load_study(args.study_dir)
    if not len(runs):
        sys.exit(f'error: {args.study_dir} holds no finished runs yet')
    return runs, arrays


def write_table(args, title, lines):
    """Print the table and keep it beside the study as paper_table.md."""
    text = '\n'.join([f'# {title}', '', *lines]) + '\n'
    with open(os.path.join(args.study_dir, 'paper_table.md'), 'w') as f:
        f.write(text)
    print(text)


def mean_and_interval(values, digits=2):
    """'93.40% ± 0.05 (n 10)': the mean in percent with the half-width of its 95% CI."""
    entry = study.describe(list(values))
    if entry['ci95'] is None:
        return f"{100 * entry['mean']:.{digits}f}% (n {entry['n']})"
    half = 100 * (entry['ci95'][1] - entry['ci95'][0]) / 2
    return f"{100 * entry['mean']:.{digits}f}% ± {half:.{digits}f} (n {entry['n']})"
