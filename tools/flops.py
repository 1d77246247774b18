"""Count the FLOPs of one training run of each script from its built network.

Two counts per script, both from torch.utils.flop_counter (2 FLOPs per multiply-add):
- exact: the training steps as run (the frozen whitening weights need no gradient, and its bias
  none after the first epochs), plus the test-time augmentation views;
- conventional: 3 x the forward FLOPs per training image processed (the usual forward + backward
  estimate), plus the TTA views;
- nominal: the conventional count over 50,000 images per epoch, as if no partial batch were dropped.
airbench96_faster adds its proxy's pass: a forward pass of every batch (1024 images), counted once
(1 x forward, no backward), and on every fourth batch a training step instead (exact: as run;
conventional: 3 x forward); its main network's steps count the 512 images it trains on.
TTA is counted as run: every test image once plus the views of the images TTA is spent on (all of
them, or with tta_fraction the least confident share, airbench94_hiverge's selective TTA).
Apart, not in those counts: newton_schulz, the Muon scripts' orthogonalization over the whole run
(airbench94_muon's per filter bank; airbench94_hiverge's on the six banks padded to one shape).

--published PATH counts hiverge's published cifar10_speedrun.py (tools/reference.py says where to
get it) with the same counter: its CifarNet's forward and training steps (its forward's
whiten_bias_grad), its infer(tta_level=2) and its _zeropower_via_newtonschulz5 as they run on meta
tensors, at the schedule its main() states (batch size, epochs, whitening-bias epochs).

Usage: python tools/flops.py [airbench94 ...] [--published PATH/cifar10_speedrun.py]
"""
import argparse
import math
import os
import re
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from studylib.scripts import load_script  # noqa: E402
# The paper's figures, and for airbench94_muon the record's (its Newton-Schulz iterations add
# about 0.001 PFLOPs, not counted here: 3 iterations of a few GFLOPs per step, 200 steps)
PAPER_PFLOPS = {'airbench94': 0.36, 'airbench95': 1.4, 'airbench96': 7.2, 'airbench94_muon': 0.29,
                'airbench96_faster': 3.1}
TTA_VIEWS = {0: 1, 1: 2, 2: 6}
META = torch.device('meta')


def count_flops(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def network_flops(script, arch, num_classes, probe_batch):
    """(forward, training step with the whitening bias trained, without it): FLOPs per image."""
    extra = [arch['convs_per_block']] if 'convs_per_block' in arch else []  # airbench96_faster
    net = script.make_net(arch['widths'], num_classes, arch['batchnorm_momentum'],
                          arch['scaling_factor'], *extra)
    inputs = torch.randn(probe_batch, 3, 32, 32)
    labels = torch.randint(0, num_classes, (probe_batch,))
    forward = count_flops(lambda: net(inputs)) / probe_batch

    def step_per_image(whiten_bias_trainable):
        net[0].bias.requires_grad = whiten_bias_trainable
        return count_flops(lambda: torch.nn.functional.cross_entropy(
            net(inputs), labels, reduction='sum').backward()) / probe_batch

    return forward, step_per_image(True), step_per_image(False)


def tta_images(arch, num_test):
    """Images the network evaluates in the timed TTA: the level's views of every test image, or
    with tta_fraction every image once and the views of the least confident share."""
    if 'tta_fraction' not in arch or arch['tta_level'] == 0:
        return TTA_VIEWS[arch['tta_level']] * num_test
    return num_test + TTA_VIEWS[arch['tta_level']] * int(num_test * arch['tta_fraction'])


def newton_schulz_flops(script, arch, steps):
    """The Muon scripts' orthogonalization over `steps` steps, run on meta tensors (0 elsewhere)."""
    if not hasattr(script, 'Muon'):
        return 0
    net = script.make_net(arch['widths'], 10, arch['batchnorm_momentum'], arch['scaling_factor'])
    shapes = [(p.size(0), p[0].numel()) for p in net.parameters()
              if p.ndim == 4 and p.requires_grad]
    iterations = script.hyp['opt']['newton_schulz_steps']
    if 'renormalization_steps' in vars(script):  # batched: the banks padded to the largest shape
        rows = max(r for r, _ in shapes)
        cols = max(c for _, c in shapes)
        per_step = count_flops(lambda: script.orthogonalize(
            torch.empty(len(shapes), rows, cols, device=META), iterations))
    else:
        per_step = sum(count_flops(lambda: script.orthogonalize(
            torch.empty(shape, device=META), iterations, torch.float32)) for shape in shapes)
    return per_step * steps


def run_flops(script, num_train=50000, num_test=10000, num_classes=10, probe_batch=4):
    """FLOPs of one run: {'forward_per_image', 'exact', 'conventional', 'nominal', 'steps',
    'newton_schulz'}, and for a script with a proxy network its pass's share of them:
    'proxy_exact', 'proxy_conventional' and 'proxy_nominal'."""
    opt = script.hyp['opt']
    arch = script.hyp['net']
    forward, step_with_bias, step_without_bias = network_flops(script, arch, num_classes,
                                                               probe_batch)
    steps_per_epoch = num_train // opt['batch_size']
    steps = math.ceil(steps_per_epoch * opt['train_epochs'])
    steps_with_bias = min(steps, math.ceil(steps_per_epoch * opt['whiten_bias_epochs']))
    trained_fraction = opt.get('masked_fraction', 1.0)
    images_per_step = round(trained_fraction * opt['batch_size'])
    tta = tta_images(arch, num_test) * forward
    exact = images_per_step * (steps_with_bias * step_with_bias
                               + (steps - steps_with_bias) * step_without_bias) + tta
    conventional = 3 * forward * images_per_step * steps + tta
    nominal = 3 * forward * num_train * opt['train_epochs'] * trained_fraction + tta
    figures = dict(forward_per_image=forward, steps=steps,
                   newton_schulz=newton_schulz_flops(script, arch, steps))
    if 'proxy' in script.hyp:  # its whitening bias is never trained
        proxy_forward, _, proxy_step = network_flops(script, script.hyp['proxy'], num_classes,
                                                     probe_batch)
        training_steps = math.ceil(steps / script.hyp['proxy']['step_every'])
        forward_steps = steps - training_steps
        trained_share = 1 / script.hyp['proxy']['step_every']
        figures.update(
            proxy_exact=opt['batch_size'] * (forward_steps * proxy_forward
                                             + training_steps * proxy_step),
            proxy_conventional=opt['batch_size'] * proxy_forward * (forward_steps
                                                                    + 3 * training_steps),
            proxy_nominal=num_train * opt['train_epochs'] * proxy_forward * (1 + 2 * trained_share))
        exact += figures['proxy_exact']
        conventional += figures['proxy_conventional']
        nominal += figures['proxy_nominal']
    return dict(figures, exact=exact, conventional=conventional, nominal=nominal)


def published_schedule(source):
    """(batch size, epochs, whitening-bias epochs) as the published hiverge main() states them."""
    def number(pattern):
        found = re.search(pattern, source)
        if found is None:
            sys.exit(f'not the published hiverge script: no {pattern!r} in it')
        return float(found.group(1))
    return (int(number(r'training_batch_size = (\d+)')),
            number(r'total_train_steps = ceil\(([0-9.]+) \* len\(train_loader\)\)'),
            number(r'whiten_bias_train_steps = ceil\(([0-9.]+) \* len\(train_loader\)\)'))


def published_flops(path, num_train=50000, num_test=10000, probe_batch=4):
    """The published hiverge script's FLOPs, as run_flops counts ours (see the docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import reference  # tools/reference.py: its definitions run on the CPU, uncompiled
    with open(path) as f:
        source = f.read()
    batch_size, epochs, whiten_bias_epochs = published_schedule(source)
    definitions, _, _, _ = reference.split_script(source, path)
    reference.redirect_cuda_to_cpu()
    published = {'__name__': 'published'}  # it reads its own source at import
    sys.argv = [path]
    exec(compile(definitions, path, 'exec'), published)
    net = published['CifarNet']()
    net.reset()
    inputs = torch.randn(probe_batch, 3, 32, 32)
    labels = torch.randint(0, 10, (probe_batch,))
    forward = count_flops(lambda: net(inputs)) / probe_batch
    step_with_bias, step_without_bias = (count_flops(lambda: torch.nn.functional.cross_entropy(
        net(inputs, whiten_bias_grad=trained), labels, reduction='sum').backward()) / probe_batch
        for trained in (True, False))
    steps_per_epoch = num_train // batch_size
    steps = math.ceil(epochs * steps_per_epoch)
    steps_with_bias = math.ceil(whiten_bias_epochs * steps_per_epoch)
    meta_net = published['CifarNet']().to(META)
    loader = type('Loader', (), dict(images=torch.empty(num_test, 3, 32, 32, device=META),
                                     normalize=staticmethod(lambda x: x)))
    tta = count_flops(lambda: published['infer'](meta_net, loader, tta_level=2))
    filters = [p for p in meta_net.parameters() if p.ndim == 4 and p.requires_grad]
    meta = [(p.shape, p.size(0), p[0].numel(), i) for i, p in enumerate(filters)]
    rows = max(p.size(0) for p in filters)
    cols = (max(p[0].numel() for p in filters) + 15) // 16 * 16  # as its Muon pads
    newton_schulz = count_flops(lambda: published['_zeropower_via_newtonschulz5'](
        [torch.empty_like(p) for p in filters], meta, rows, cols, 1, steps))
    exact = batch_size * (steps_with_bias * step_with_bias
                          + (steps - steps_with_bias) * step_without_bias) + tta
    return dict(forward_per_image=forward, steps=steps, tta=tta, exact=exact,
                conventional=3 * forward * batch_size * steps + tta,
                nominal=3 * forward * num_train * epochs + tta, newton_schulz=newton_schulz * steps)


def print_row(name, figures, paper=float('nan')):
    print(f'{name:<26}{figures["steps"]:>6}{figures["forward_per_image"] / 1e6:>15.1f}'
          f'{figures["exact"] / 1e15:>14.3f}{figures["conventional"] / 1e15:>14.3f}'
          f'{figures["nominal"] / 1e15:>9.3f}{figures["newton_schulz"] / 1e15:>15.4f}'
          f'{paper:>7.2f}')


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('names', nargs='*', default=[*PAPER_PFLOPS, 'airbench94_hiverge'])
    parser.add_argument('--published', help="the published hiverge cifar10_speedrun.py")
    args = parser.parse_args(argv)
    print(f'{"script":<26}{"steps":>6}{"fwd MFLOP/img":>15}{"exact PFLOPs":>14}'
          f'{"conventional":>14}{"nominal":>9}{"newton_schulz":>15}{"paper":>7}')
    for name in args.names:
        print_row(name, run_flops(load_script(name)), PAPER_PFLOPS.get(name, float('nan')))
    if args.published:
        print_row('published hiverge', published_flops(args.published))


if __name__ == '__main__':
    main(sys.argv[1:])
