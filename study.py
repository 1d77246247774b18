"""study.py: many trainings of the airbench scripts (or your copies of them), on every GPU of one or
many machines, with the statistics and analyses that research studies need.

    python study.py SCRIPT --runs N --study-dir DIR [--config NAME [SCRIPT] [KEY=VALUE ...]]...
                    [--grid KEY=V1,V2,...]... [--seed S] [--vary init|order|aug|all]
                    [--target ACC] [--save-logits] [--train-subset FRACTION] [--val-split N]
                    [-- FLAGS FOR THE SCRIPTS]
    torchrun --nproc_per_node=8 study.py SCRIPT ...              (every GPU of a machine)
    torchrun --nnodes=2 --node-rank=R --nproc_per_node=8 --rdzv-endpoint=HOST:PORT study.py ...
    python study.py report DIR [--target ACC] [--speedup] [--variance]   (no training)

Configurations. Each --config NAME [SCRIPT] KEY=VALUE... is a script's hyp (SCRIPT: a script of
this repository by name, or the path of any .py file with their interface; default the positional
SCRIPT) with those overrides, after the flags after --. Each --grid expands every configuration
over its values (all combinations), named NAME,KEY=VALUE,... A study is its settings and its
configurations (each its script's SHA-256 and resolved hyp): the same command continues it, a
later command may add configurations or runs, and one that changes either is refused.

Seeds. Run i of every configuration, whatever its script, uses the same seeds of each source of
randomness (initialization, data order, augmentation: the positional script's source_seeds), so
configurations compare pair by pair; --vary names the sources that change from run to run.

The engine is the package studylib beside this file (cli, scripts, plan, distribute, runs, stats,
fits, variance, report, load); this file is its command and its importable face:

    import study
    runs, arrays = study.load_study('studies/flip')     # a pandas DataFrame, and saved logits
    study.epochs_to_accuracy([10, 20, 40], [0.9310, 0.9374, 0.9401], 0.94)
    study.effective_speedup([10, 20, 40, 80], [0.9310, 0.9374, 0.9401, 0.9412], 20, 0.9387)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from studylib.fits import effective_speedup, epochs_to_accuracy, fit_power_law  # noqa: E402
from studylib.launch import main  # noqa: E402
from studylib.load import load_study  # noqa: E402
from studylib.report import write_outputs  # noqa: E402
from studylib.stats import describe  # noqa: E402

__all__ = ['main', 'load_study', 'write_outputs', 'effective_speedup', 'epochs_to_accuracy',
           'fit_power_law', 'describe']

if __name__ == '__main__':
    sys.exit(main())
