"""A study's outputs, rebuilt from its records: summary.json (studylib.summary's numbers),
report.md (studylib.markdown), runs.csv and the plots (studylib.plots). An analysis that cannot be
made says why in its place; only a study directory that cannot be read stops the report."""
import json
import math
import os
import sys

from .cli import parse_report_args
from .errors import ReportFailed, StorageError, StudyError
from .files import atomic_write
from .looks import record_look
from .markdown import report_lines
from .plots import plot
from .summary import summarize


def json_safe(value):
    """JSON without NaN or Infinity: a float that is not finite becomes null (its analysis says
    why in a reason field)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_outputs(study_dir, target=None, resolve=None, require_speedup=False,
                  require_variance=False, margin=None, time_margin=None):
    """Write summary.json, runs.csv, report.md and the plots. Raises StudyError only for a study
    directory that cannot be read, or an analysis that require_* asks for and that is absent
    (after writing everything else)."""
    summary, runs = summarize(study_dir, target, resolve, margin, time_margin)
    summary = json_safe(summary)
    record_look(study_dir, summary, target)
    atomic_write(os.path.join(study_dir, 'summary.json'), json.dumps(summary, indent=2))
    atomic_write(os.path.join(study_dir, 'runs.csv'), runs.to_csv(index=False))
    try:
        plot(study_dir, summary, runs)
    except Exception as error:  # noqa: BLE001: a plot that fails never costs the report
        summary['plots_reason'] = f'the plots failed ({type(error).__name__}: {error})'
    lines = report_lines(summary)
    if 'plots_reason' in summary:
        lines += ['', f"Plots: {summary['plots_reason']}."]
    atomic_write(os.path.join(study_dir, 'report.md'), '\n'.join(lines) + '\n')
    for name, wanted in (('speedup', require_speedup), ('variance', require_variance)):
        section = summary[name]
        if wanted and isinstance(section, dict) and set(section) == {'reason'}:
            raise StudyError(f"no {name} analysis: {section['reason']}")
    return summary


def write_report(study_dir, resolve=None):
    """The summary, report and plots at the end of a launch; None, or what went wrong and how to
    rebuild them (the runs are written whatever the analyses raise)."""
    try:
        write_outputs(study_dir, resolve=resolve)
    except Exception as error:  # noqa: BLE001: whatever the analyses raise, the runs are kept
        return report_failure(study_dir, error)
    return None


def report_failure(study_dir, error):
    message = (str(error).splitlines() or [''])[0][:300]
    return (f'the report of {study_dir} could not be written ({type(error).__name__}: {message}); '
            f'the runs are kept: rebuild it with python study.py report {study_dir}')


def main(argv):
    """study.py report DIR: 0 with the report written (a warning line for each damaged file it
    does not count), 1 for a command or directory refused, 3 where no report could be written."""
    try:
        args = parse_report_args(argv)
        summary = write_outputs(args.study_dir, target=args.target, resolve=args.resolve,
                                require_speedup=args.speedup, require_variance=args.variance,
                                margin=args.margin, time_margin=args.time_margin)
    except StorageError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    except StudyError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return StudyError.exit_status
    except Exception as error:  # noqa: BLE001: an analysis or a write that fails says so
        print(f'error: {report_failure(args.study_dir, error)}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    for line in summary['damaged']:
        print(f'warning: damaged, not counted: {line}', file=sys.stderr, flush=True)
    print(f'rebuilt {args.study_dir}: summary.json, report.md, runs.csv and the plots')
    return 0
