"""study.py: many trainings of the airbench scripts (or your copies of them), on every GPU of one or
many machines, with the statistics and analyses that research studies need.

    python study.py SCRIPT --runs N --study-dir DIR [--config NAME [SCRIPT] [KEY=VALUE ...]]...
                    [--grid KEY=V1,V2,...]... [--seed S] [--vary init|order|aug|all]
                    [--target ACC] [--resolve DELTA] [--save-logits] [--train-subset FRACTION]
                    [--val-split N]
                    [-- FLAGS FOR THE SCRIPTS]
    torchrun --nproc_per_node=8 study.py SCRIPT ...              (every GPU of a machine)
    torchrun --nnodes=2 --node-rank=R --nproc_per_node=8 --rdzv-endpoint=HOST:PORT study.py ...
    python study.py report DIR [--target ACC] [--resolve DELTA] [--margin POINTS]
                    [--time-margin RATIO] [--speedup] [--variance]

Configurations. Each --config NAME [SCRIPT] KEY=VALUE... is a script's hyp (SCRIPT: a script of
this repository by name, or the path of any .py file with their interface; default the positional
SCRIPT) with those overrides, after the flags after --. Each --grid expands every configuration
over its values (all combinations), named NAME,KEY=VALUE,... A study is its settings and its
configurations (each its script's SHA-256 and resolved hyp): the same command continues it, a
later command may add configurations or runs, and one that changes either is refused.

Seeds. Run i of every configuration, whatever its script, uses the same seeds of each source of
randomness (initialization, data order, augmentation: the positional script's source_seeds), so
configurations compare pair by pair; --vary names the sources that change from run to run.

The engine is the package studylib beside this file; this file is its command and its importable
face. The statistics work on plain arrays of per-run numbers (docs/studies.md, "The statistics"):

    import study
    runs, arrays = study.load_study('studies/flip')     # a pandas DataFrame, and saved logits
    study.compare(random_runs, alternating_runs, paired=True)   # difference, CI, p, effect size
    study.target_test(accuracies, 0.94, diverged=[0.1])  # "mean > 0.94", every run counted
    study.equivalence_test(a_times, b_times, 1.05, ratio=True)  # "as fast as", within 5%
    study.runs_needed(std=0.0015, difference=0.0008)     # runs per configuration at 80% power
    study.epochs_to_accuracy_interval({10: [...], 20: [...], 40: [...]}, 0.94)
    study.effective_speedup_interval(baseline_runs_by_epochs, runs, 20)
    study.calibration_error(predictions, labels)        # runs x examples class ids
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from studylib.stats.fits import (effective_speedup, effective_speedup_interval,  # noqa: E402
                           epochs_to_accuracy, epochs_to_accuracy_interval, fit_power_law)
from studylib.stats.inference import (compare, describe, equivalence_test, holm,  # noqa: E402
                                runs_needed, statistical_power, target_test, time_ratio)
from studylib.cli import main  # noqa: E402
from studylib.tables import load_study  # noqa: E402
from studylib.report import write_outputs  # noqa: E402
from studylib.stats.variance import (EnsembleTally, calibration_error,  # noqa: E402
                               distribution_wise_variance, test_set_std)

__all__ = ['main', 'load_study', 'write_outputs', 'compare', 'target_test', 'equivalence_test',
           'runs_needed', 'statistical_power', 'describe', 'holm', 'time_ratio',
           'epochs_to_accuracy', 'epochs_to_accuracy_interval', 'effective_speedup',
           'effective_speedup_interval', 'fit_power_law', 'calibration_error', 'EnsembleTally',
           'distribution_wise_variance', 'test_set_std']

if __name__ == '__main__':
    sys.exit(main())
