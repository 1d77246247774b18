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

Usage: python tools/flops.py [airbench94 ...]
"""
import importlib.util
import math
import os
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paper's figures, and for airbench94_muon the record's (its Newton-Schulz iterations add
# about 0.001 PFLOPs, not counted here: 3 iterations of a few GFLOPs per step, 200 steps)
PAPER_PFLOPS = {'airbench94': 0.36, 'airbench95': 1.4, 'airbench96': 7.2, 'airbench94_muon': 0.29,
                'airbench96_faster': 3.1}
TTA_VIEWS = {0: 1, 1: 2, 2: 6}


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def run_flops(script, num_train=50000, num_test=10000, num_classes=10, probe_batch=4):
    """FLOPs of one run: {'forward_per_image', 'exact', 'conventional', 'nominal', 'steps'}, and
    for a script with a proxy network its pass's share of them: 'proxy_exact', 'proxy_conventional'
    and 'proxy_nominal'."""
    opt, arch = script.hyp['opt'], script.hyp['net']
    forward, step_with_bias, step_without_bias = network_flops(script, arch, num_classes,
                                                               probe_batch)
    steps_per_epoch = num_train // opt['batch_size']
    steps = math.ceil(steps_per_epoch * opt['train_epochs'])
    steps_with_bias = min(steps, steps_per_epoch * opt['whiten_bias_epochs'])
    trained_fraction = opt.get('masked_fraction', 1.0)
    images_per_step = round(trained_fraction * opt['batch_size'])
    tta = TTA_VIEWS[arch['tta_level']] * num_test * forward
    exact = images_per_step * (steps_with_bias * step_with_bias
                               + (steps - steps_with_bias) * step_without_bias) + tta
    conventional = 3 * forward * images_per_step * steps + tta
    nominal = 3 * forward * num_train * opt['train_epochs'] * trained_fraction + tta
    figures = dict(forward_per_image=forward, steps=steps)
    if 'proxy' in script.hyp:  # its whitening bias is never trained
        proxy_forward, _, proxy_step = network_flops(script, script.hyp['proxy'], num_classes,
                                                     probe_batch)
        training_steps = math.ceil(steps / script.hyp['proxy']['step_every'])
        forward_steps, trained_share = steps - training_steps, 1 / script.hyp['proxy']['step_every']
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


def main(names):
    print(f'{"script":<18}{"steps":>6}{"fwd MFLOP/img":>15}{"exact PFLOPs":>14}'
          f'{"conventional":>14}{"nominal":>9}{"paper":>7}')
    for name in names:
        figures = run_flops(load_script(name))
        print(f'{name:<18}{figures["steps"]:>6}{figures["forward_per_image"] / 1e6:>15.1f}'
              f'{figures["exact"] / 1e15:>14.3f}{figures["conventional"] / 1e15:>14.3f}'
              f'{figures["nominal"] / 1e15:>9.3f}{PAPER_PFLOPS.get(name, float("nan")):>7.2f}')


if __name__ == '__main__':
    main(sys.argv[1:] or list(PAPER_PFLOPS))
