"""Same seed, same result: each script's train() from one seed on a slice of real data, on the CPU
in fp32, reduced to a fingerprint (each epoch's loss, the plain and TTA accuracies, the steps, and a
hash of the trained network's state). Run it before and after a change that should not change what
a script computes (a refactor, a move of shared code) and compare the two: --out saves the
fingerprints, --compare reads earlier ones and names each script that differs, and in what.

The slice: --images training and as many test images drawn at random (seed 0) from DIR's splits,
the script's hyp with --epochs and a batch size of at most --batch-size. A run on the CPU is bitwise
reproducible for a given machine, torch and thread count (README, "Reproducibility"), so the
fingerprints record torch's version and threads, and --compare refuses fingerprints of others.

Usage: python tools/same_seed.py [SCRIPT ...] --data-dir DIR [--images 2000] [--seed 5]
                                 [--epochs 1] [--batch-size 500] [--out FILE] [--compare FILE]
(all seven scripts by default; exit status 1 when --compare finds a difference)
"""
import argparse
import hashlib
import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from studylib.hyp import with_entries  # noqa: E402
from studylib.scripts import available_scripts, load_script  # noqa: E402
SCRIPTS = available_scripts()
FIELDS = ['epoch_train_losses', 'val_acc', 'tta_val_acc', 'steps', 'state_sha256']


def data_slice(data, images):
    """`images` training and as many test images of data, drawn at random (seed 0)."""
    generator = torch.Generator().manual_seed(0)
    sliced = dict(data)
    for split in ('train', 'test'):
        count = min(images, len(data[split]['labels']))
        chosen = torch.randperm(len(data[split]['labels']), generator=generator)[:count]
        sliced[split] = {key: value[chosen] for key, value in data[split].items()}
    return sliced


def state_hash(net):
    """sha256 of the network's state: every entry's name and bytes, in order."""
    digest = hashlib.sha256()
    for key, value in net.state_dict().items():
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def fingerprint(module, data, seed, epochs, batch_size):
    """What one run of the script's train() computed, on the CPU in fp32."""
    hyp = with_entries(module.hyp, {'opt.train_epochs': epochs,
                                    'opt.batch_size': min(module.hyp['opt']['batch_size'],
                                                          batch_size)})
    result = module.train(data, hyp, torch.device('cpu'), 'fp32', seed)
    return dict(epoch_train_losses=result['epoch_train_losses'], val_acc=result['val_acc'],
                tta_val_acc=result['tta_val_acc'], steps=result['steps'],
                state_sha256=state_hash(result['net']))


def differences(before, after):
    """Lines naming each script whose fingerprint differs, and in which fields."""
    lines = []
    for name in sorted(set(before['scripts']) & set(after['scripts'])):
        fields = [f for f in FIELDS if before['scripts'][name][f] != after['scripts'][name][f]]
        if fields:
            lines.append(f"{name}: {', '.join(fields)} differ")
    return lines


def settings_clash(before, after):
    """Why two sets of fingerprints cannot be compared (None when they can)."""
    for key in ('torch', 'threads', 'settings'):
        if before[key] != after[key]:
            return (f'the fingerprints were made with {key} {before[key]}, these with '
                    f'{after[key]}: make both the same way')
    return None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('scripts', nargs='*', default=SCRIPTS, metavar='SCRIPT')
    parser.add_argument('--data-dir', required=True, help='CIFAR-10 or an image folder')
    parser.add_argument('--images', type=int, default=2000)
    parser.add_argument('--seed', type=int, default=5)
    parser.add_argument('--epochs', type=float, default=1)
    parser.add_argument('--batch-size', type=int, default=500)
    parser.add_argument('--out', help='write the fingerprints to this JSON file')
    parser.add_argument('--compare', help='a JSON file of --out to compare with')
    args = parser.parse_args(argv)
    unknown = [name for name in args.scripts if name not in SCRIPTS]
    if unknown:
        parser.error(f"unknown script {unknown[0]}: one of {', '.join(SCRIPTS)}")
    if args.images < 1 or args.batch_size < 1 or args.epochs <= 0:
        parser.error('--images, --batch-size and --epochs must be positive')
    return args


def main(argv=None):
    args = parse_args(argv)
    before = None
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
    data = data_slice(load_script('airbench94').load_dataset(args.data_dir), args.images)
    settings = dict(images=args.images, seed=args.seed, epochs=args.epochs,
                    batch_size=args.batch_size)
    after = dict(torch=torch.__version__, threads=torch.get_num_threads(), settings=settings,
                 scripts={})
    if before is not None and settings_clash(before, after):
        sys.exit(f'error: {settings_clash(before, after)}')
    for name in args.scripts:
        after['scripts'][name] = fingerprint(load_script(name), data, args.seed, args.epochs,
                                             args.batch_size)
        print(json.dumps({'script': name, **after['scripts'][name]}), flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(after, f, indent=1)
    if before is None:
        return 0
    lines = differences(before, after)
    print('\n'.join(lines) if lines else f"the same in all {len(after['scripts'])} scripts")
    return 1 if lines else 0


if __name__ == '__main__':
    sys.exit(main())
