"""A study's outputs, rebuilt from its records: summary.json (studylib.summary's numbers),
report.md (studylib.markdown), runs.csv and the plots (studylib.plots). An analysis that cannot be
made says why in its place; only a study directory that cannot be read stops the report."""
import json
import math
import os

from .errors import StudyError
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
