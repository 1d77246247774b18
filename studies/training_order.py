"""The paper's training-order table (tab:traindist): random reshuffling against sampling with
replacement, each with and without alternating flip, airbench94 as it is otherwise.

    python studies/training_order.py --study-dir results/order -- --data-dir data/cifar10
    torchrun --nproc_per_node=8 studies/training_order.py --study-dir results/order --runs 1000

Cost: 4 configurations x --runs runs of airbench94 (3.83 s each on an A100): 1.7 A100-hours at
n = 400, the n of the paper's other tables (this table gives none); the 0.08-point differences
it reports need n of a few hundred per cell to resolve. Time is proportional to --runs.
"""
import sys

from paper import mean_and_interval, parse, run, write_table

ORDERS = {'reshuffle': 'Yes', 'replacement': 'No'}       # the paper's "random reshuffling"
FLIPS = {'random': 'No', 'alternating': 'Yes'}           # and its "alternating flip"


def configs():
    return [flag for order in ORDERS for flip in FLIPS for flag in
            ('--config', f'{order}-{flip}', f'opt.sampling={order}', f'aug.flip={flip}')]


def table(runs):
    lines = ['| Random reshuffling | Alternating flip | Mean accuracy (95% CI) |', '|---|---|---|']
    for order, reshuffled in reversed(ORDERS.items()):
        for flip, alternating in FLIPS.items():
            accuracies = runs.loc[runs['config'] == f'{order}-{flip}', 'accuracy']
            if len(accuracies):
                lines.append(f'| {reshuffled} | {alternating} | {mean_and_interval(accuracies)} |')
    return lines


def main(argv):
    args = parse(__doc__.splitlines()[0], 400, argv)
    found = run(args, ['airbench94', *configs()])
    if found is not None:
        write_table(args, 'Training distribution options (the paper: 93.40, 93.48, 93.92, 94.01%)',
                    table(found[0]))


if __name__ == '__main__':
    main(sys.argv[1:])
