"""Check, piece by piece, that airbench94_hiverge.py computes what the published hiverge script
computes (hiverge/cifar10-speedrun's cifar10_speedrun.py, commit 06c6072) when both start from the
same weights and see the same batches, on this CPU in our precision.

A side by side of whole runs compares two random samples; this tool removes the randomness. It
loads the published definitions as tools/reference.py does (CUDA redirected to the CPU, the network
under bf16 autocast, or in fp32 with --precision fp32) and compares:
- the networks: parameters and buffers in the same order and shapes; the logits, the loss, the
  gradients and the BatchNorm statistics of one training step, and the logits in evaluation mode;
- the CUDA recipe's precision per layer: the published CifarNet as written (every module halved,
  BatchNorm too; this tool otherwise runs it in our CPU precision) against ours from build_net(...,
  'fp16'): every parameter and buffer with the same dtype, in the same order and shapes; then, on
  this CPU's fp16 kernels (eager: slow, and only a check of the arithmetic), one training step of
  both from the same weights on the same batch, compared as above (the loss as our train() takes
  it, the cross-entropy of the logits in fp32);
- the whitening filters from the same 960 images (the published takes torch.svd of the patches'
  second-moment matrix, ours eigh: equal up to each eigenvector's sign);
- the jitter: the published draws from torch's global generator, our loader from a generator seeded
  alike;
- the batched orthogonalization: the published _zeropower_via_newtonschulz5 against our padding and
  orthogonalize, on the same six updates (a training step's gradients), in fp32 and in the dtype
  each runs on this CPU (the published in its updates' fp32, ours in bf16); the published scales
  each update to a "target magnitude" before normalizing it, which cancels but for its epsilons;
- the selective TTA: the published infer(..., tta_level=2) against ours from the same network: the
  chosen examples, their logits, the others' logits;
- training: the published main() for E epochs (--epochs; its schedule, loader, optimizers and
  evaluation, as written) keeps its initial weights, whitening filters, every batch it trains on
  and its state after each step; our train() then starts from those weights and filters, is fed
  those batches (and its normalization of the test images) and is compared step by step (the first
  --steps) and at the end (state, TTA accuracy). Twice: as ours runs on this CPU (Newton-Schulz in
  bf16 under bf16 autocast, fp32 momentum, PyTorch's default SGD), and matched to how the published
  runs here (Newton-Schulz in fp32, fp16 momentum buffers, fused SGD, its lr multipliers'
  formula).
What remains after matching, and why, is in docs/cpu.md ("airbench94_hiverge against the published
script").

Usage: python tools/hiverge_equivalence.py PATH/cifar10_speedrun.py --data-dir DIR [--steps 8]
           [--epochs 1] [--precision auto|bf16|fp32] [--workdir /tmp/airbench-reference]
Prints one JSON line per check.
"""
import collections
import contextlib
import functools
import json
import os
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import equivalence  # noqa: E402  (tools/equivalence.py)
import reference  # noqa: E402  (tools/reference.py)
import airbench94_hiverge as ours  # noqa: E402
from equivalence import CPU, largest_difference, snapshot  # noqa: E402
from studylib.data import load_study_data  # noqa: E402
from studylib.device import resolve_device_precision  # noqa: E402

PRECISION = 'bf16'  # or 'fp32' (--precision): the recipe both run in
# fp16 as PyTorch has it: load_published maps half() to float() (tools/reference.py); the fp16
# recipe's check builds the published network with these
MODULE_HALF = nn.Module.half
TENSOR_HALF = torch.Tensor.half
FP16_BATCH = 64  # images of the fp16 step: the CPU's fp16 kernels are slow (docs/cpu.md)
JITTER = {'enabled': True, 'brightness_range': 0.1399, 'contrast_range': 0.1308}


def autocast():
    return torch.autocast('cpu', dtype=torch.bfloat16, enabled=PRECISION == 'bf16')


def load_published(path, epochs):
    """The published definitions, its CUDA calls on the CPU, its network in our precision, its
    schedule fitted to `epochs`."""
    published = equivalence.load_published(path, 'published', lambda source: (
        reference.STEPS_IN_EPOCHS.sub(f'total_train_steps = ceil({epochs!r} * len(train_loader))',
                                      source)))
    network = published['CifarNet']
    published['CifarNet.forward as written'] = network.forward  # the fp16 recipe's check runs it
    network.forward = reference.in_precision(network.forward, PRECISION == 'bf16')
    published['print_training_details'] = lambda *args, **kwargs: None
    return published


@functools.cache
def our_state_names():
    """Our network's state dict entries, in order (built once: our_run's stand-in for reinitialize
    loads a state through these names, and building a network calls reinitialize)."""
    return list(ours.build_net(ours.hyp['net'], 10, CPU, PRECISION).state_dict())


def our_state(their_state):
    """Their state dict under our names (the same entries in the same order, checked)."""
    names = our_state_names()
    assert len(names) == len(their_state)
    return dict(zip(names, their_state.values()))


def our_net(their_net):
    mine = ours.build_net(ours.hyp['net'], 10, CPU, PRECISION)
    mine.load_state_dict(our_state(their_net.state_dict()))
    return mine


def same_networks(published):
    theirs = published['CifarNet']()
    theirs.reset()
    mine = our_net(theirs)
    same_shapes = [tuple(t.shape) for t in theirs.state_dict().values()] == [
        tuple(t.shape) for t in mine.state_dict().values()]
    inputs = torch.randn(256, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(10, (256,))
    step = equivalence.one_training_step(theirs, mine, inputs, labels, 0.09, autocast())
    trained = [[p.requires_grad for p in net.parameters()] for net in (theirs, mine)]
    result = dict(check='network', same_entries_and_shapes=same_shapes,
                  same_trained=trained[0] == trained[1], **step)
    return result, [p.grad.clone() for p in mine.parameters() if p.grad is not None and p.ndim == 4]


def entry_dtypes(net):
    """{state dict entry: its dtype's name}, in order."""
    return {name: str(t.dtype).removeprefix('torch.') for name, t in net.state_dict().items()}


def same_fp16_recipe(published):
    """The published CifarNet with every module halved, as written, against ours built in the fp16
    recipe: entries of the same shape and dtype, in order; then one training step of both from the
    same weights on one batch in fp16 (eager, on this CPU's kernels)."""
    with equivalence.stood_in(nn.Module, half=MODULE_HALF), \
            equivalence.stood_in(torch.Tensor, half=TENSOR_HALF):
        theirs = published['CifarNet']()
        theirs.reset()
        mine = ours.build_net(ours.hyp['net'], 10, CPU, 'fp16')
    theirs.forward = types.MethodType(published['CifarNet.forward as written'], theirs)
    their_dtypes = entry_dtypes(theirs)
    my_dtypes = entry_dtypes(mine)
    their_shapes = [tuple(t.shape) for t in theirs.state_dict().values()]
    my_shapes = [tuple(t.shape) for t in mine.state_dict().values()]
    differing = [name for name, theirs_dtype, my_dtype
                 in zip(my_dtypes, their_dtypes.values(), my_dtypes.values())
                 if theirs_dtype != my_dtype]
    batchnorm = [f'{name}.{entry}' for name, module in mine.named_modules()
                 if isinstance(module, nn.BatchNorm2d)
                 for entry in ('weight', 'bias', 'running_mean', 'running_var')]
    mine.load_state_dict(our_state(theirs.state_dict()))
    inputs = torch.randn(FP16_BATCH, 3, 32, 32, dtype=torch.half)
    labels = torch.randint(10, (FP16_BATCH,))
    step = equivalence.one_training_step(theirs, mine,
                                         inputs.contiguous(memory_format=torch.channels_last),
                                         labels, 0.09, contextlib.nullcontext())
    return dict(check='fp16 recipe', entries=len(my_dtypes), same_shapes=their_shapes == my_shapes,
                same_dtypes=not differing, differing_dtypes=differing,
                published_dtypes=collections.Counter(their_dtypes.values()),
                our_batchnorm_dtypes=sorted({my_dtypes[name] for name in batchnorm}),
                images=FP16_BATCH, **step)


def same_whitening(published, images):
    theirs = published['CifarNet']()
    theirs.init_whiten(images)
    mine = ours.build_net(ours.hyp['net'], 10, CPU, PRECISION)
    ours.init_whitening(mine[0], images, ours.hyp['net']['whiten_eps'])
    flipped, up_to_sign, scale = equivalence.filters_up_to_sign(theirs.whiten.weight,
                                                                mine[0].weight)
    return dict(check='whitening filters', images=len(images), filters=len(theirs.whiten.weight),
                sign_flipped=flipped, largest_difference_up_to_sign=up_to_sign, scale=scale)


def same_jitter(published, images):
    """The published jitter of normalized images against our loader's epoch of the same images,
    with the jitter alone (no flip, no translation), its draws from a generator seeded alike."""
    torch.manual_seed(5)
    theirs = published['batch_color_jitter'](images, JITTER['brightness_range'],
                                             JITTER['contrast_range'])
    aug = {**ours.hyp['aug'], 'flip': 'none', 'translate': 0}
    placeholder = torch.zeros(len(images), 32, 32, 3, dtype=torch.uint8)
    loader = ours.CifarLoader(placeholder, torch.zeros(len(images), dtype=torch.int64),
                              len(images), (0.0,) * 3, (1.0,) * 3, aug,
                              aug_generator=torch.Generator().manual_seed(5))
    loader.padded_images = images  # as if normalized (and, untranslated, not padded) by it
    mine = loader.augmented_epoch()
    return dict(check='jitter', images=len(images), largest_difference=largest_difference(
        [theirs], [mine]))


def our_orthogonalization(updates, dtype):
    """What our Muon.step does with a list of updates: flatten, pad, orthogonalize, cut back."""
    flat = [u.flatten(1) for u in updates]
    rows, cols = max(u.size(0) for u in flat), max(u.size(1) for u in flat)
    padded = torch.stack([F.pad(u, (0, cols - u.size(1), 0, rows - u.size(0))) for u in flat])
    result = ours.orthogonalize(padded.to(dtype), ours.hyp['opt']['newton_schulz_steps'])
    return [r[:u.size(0), :u.size(1)].reshape(v.shape).float()
            for r, u, v in zip(result, flat, updates)]


def same_orthogonalization(published, updates, total_steps):
    meta = [(u.shape, u.size(0), u[0].numel(), i) for i, u in enumerate(updates)]
    max_rows = max(u.size(0) for u in updates)
    max_cols = (max(u[0].numel() for u in updates) + 15) // 16 * 16  # as its Muon pads
    result = dict(check='batched orthogonalization', banks=[tuple(u.shape) for u in updates])
    for step in (1, total_steps):  # its target magnitude moves with the step
        theirs = published['_zeropower_via_newtonschulz5'](updates, meta, max_rows, max_cols, step,
                                                           total_steps)
        for name, dtype in (('fp32', torch.float32), ('bf16', torch.bfloat16)):
            mine = our_orthogonalization(updates, dtype)
            relative = max(((a - b).abs().max() / a.abs().max()).item()
                           for a, b in zip(theirs, mine))
            result[f'step_{step}_{name}_largest_relative_difference'] = relative
    return result


def same_selective_tta(published, net_state, images):
    theirs = published['CifarNet']()
    theirs.load_state_dict(net_state)
    mine = our_net(theirs)
    loader = types.SimpleNamespace(images=images, normalize=lambda x: x)
    their_plain = published['infer'](theirs, loader, tta_level=0).float()
    their_tta = published['infer'](theirs, loader, tta_level=2).float()
    my_plain = ours.infer(mine, images, 0, autocast())
    my_tta = ours.infer(mine, images, 2, autocast(), tta_fraction=ours.hyp['net']['tta_fraction'])
    their_chosen, my_chosen = (their_tta != their_plain).any(1), (my_tta != my_plain).any(1)
    both = their_chosen & my_chosen
    return dict(check='selective TTA', images=len(images), their_chosen=their_chosen.sum().item(),
                our_chosen=my_chosen.sum().item(), same_chosen=torch.equal(their_chosen, my_chosen),
                plain_logits=largest_difference([their_plain], [my_plain]),
                chosen_logits=largest_difference([their_tta[both]], [my_tta[both]]),
                other_logits=largest_difference([their_tta[~my_chosen]], [my_tta[~my_chosen]]),
                same_predictions=(their_tta.argmax(1) == my_tta.argmax(1)).float().mean().item())


def published_run(published, keep_steps):
    """The published main() for one run: its TTA accuracy, and what ours needs to follow it."""
    kept = dict(batches=[], states=[])
    model = published['CifarNet']()
    reset, init_whiten = model.reset, model.init_whiten

    def reset_and_keep():
        reset()
        kept['initial'] = snapshot(model)

    def whiten_and_keep(images, *args, **kwargs):
        init_whiten(images, *args, **kwargs)
        kept['whitening'] = model.whiten.weight.detach().clone()

    loader_class, muon_class = published['CifarLoader'], published['Muon']
    iterate, muon_step = loader_class.__iter__, muon_class.step

    def keep_batches(loader):
        for images, labels in iterate(loader):
            kept['batches'].append((images.clone(), labels.clone()))
            yield images, labels

    def step_and_keep(optimizer):
        muon_step(optimizer)
        if len(kept['states']) < keep_steps:
            kept['states'].append(snapshot(model))

    model.reset, model.init_whiten = reset_and_keep, whiten_and_keep
    loader_class.__iter__, muon_class.step = keep_batches, step_and_keep
    try:
        torch.manual_seed(0)
        _, tta_accuracy, _ = published['main'](1, model)
    finally:
        loader_class.__iter__, muon_class.step = iterate, muon_step
    kept['final'] = model.state_dict()
    train_loader = loader_class('cifar10', train=True)
    kept['normalize'], kept['train_images'] = train_loader.normalize, train_loader.images
    return tta_accuracy, kept


class Replay:
    """Our CifarLoader's interface over the published run's batches, epoch by epoch."""

    def __init__(self, kept, batch_size):
        self.kept, self.batch_size, self.images = kept, batch_size, kept['train_images']
        self.steps_per_epoch = 50000 // batch_size

    def normalize(self, images):
        return self.kept['normalize'](images)

    def __len__(self):
        return self.steps_per_epoch

    def __iter__(self):
        epoch, self.epoch = getattr(self, 'epoch', 0), getattr(self, 'epoch', 0) + 1
        yield from self.kept['batches'][epoch * len(self):(epoch + 1) * len(self)]


def our_run(kept, data, epochs, keep_steps, matched):
    """Our train() from the published run's start, on its batches: TTA accuracy, states per step
    (the first keep_steps) and the final state."""
    states, names = [], {}
    reinitialize, base_muon, sgd = ours.reinitialize, ours.Muon, torch.optim.SGD

    def reinitialize_from(net):
        reinitialize(net)
        net.load_state_dict(our_state(kept['initial']))
        names['net'] = net

    def whitening_from(layer, images, eps):
        with torch.no_grad():
            layer.weight.copy_(kept['whitening'])

    class KeepingMuon(base_muon):
        def __init__(self, params, lr, momentum, steps, weight_decay, dtype, compiled=False):
            super().__init__(params, lr, momentum, steps, weight_decay,
                             torch.float32 if matched else dtype, compiled)
            if matched:  # the published keeps its Muon momentum in fp16
                for weight in self.param_groups[0]['params']:
                    self.state[weight]['momentum'] = torch.zeros_like(weight, dtype=torch.half)

        def step(self, renormalize):
            super().step(renormalize)
            if len(states) < keep_steps:
                states.append(snapshot(names['net']))

    class FusedSGD(sgd):
        def __init__(self, params, **kwargs):
            super().__init__(params, **{**kwargs, 'fused': True})

    our_state_names()  # before the stand-ins
    replay = Replay(kept, ours.hyp['opt']['batch_size'])
    stand_ins = dict(reinitialize=reinitialize_from, init_whitening=whitening_from,
                     CifarLoader=lambda *args, **kwargs: replay, Muon=KeepingMuon)
    if matched:  # the published's lr multipliers: 1 - step * (1 / total_steps)
        stand_ins['lr_schedule'] = lambda total: [1 - step * (1.0 / total)
                                                  for step in range(total + 1)]
    optimizers = (equivalence.stood_in(torch.optim, SGD=FusedSGD) if matched
                  else contextlib.nullcontext())
    with equivalence.stood_in(ours, **stand_ins), optimizers:
        result = ours.train(data, equivalence.with_epochs(ours.hyp, epochs), CPU, PRECISION,
                            seed=0, epoch_eval=False)
    return result['tta_val_acc'], states, result['net'].state_dict()


def same_training(published, data, epochs, keep_steps):
    their_accuracy, kept = published_run(published, keep_steps)
    theirs = [our_state(state) for state in kept['states']]
    final = our_state(kept['final'])
    results = []
    for matched in (False, True):
        accuracy, states, mine = our_run(kept, data, epochs, keep_steps, matched)
        differences, largest = equivalence.entry_differences(final, mine)
        results.append(dict(
            check='training ' + ('matched to the published arithmetic' if matched else 'as run'),
            epochs=epochs, steps=len(kept['batches']),
            largest_state_difference_per_step=[largest_difference(a.values(), b.values())
                                               for a, b in zip(theirs, states)],
            published_tta_accuracy=their_accuracy, our_tta_accuracy=accuracy,
            final_entries_that_differ=sum(d > 0 for d in differences.values()),
            final_entries=len(differences), largest_final_difference=differences[largest],
            in_entry=largest, whose_largest_value=final[largest].float().abs().max().item()))
    return results, kept


def add_arguments(parser):
    parser.add_argument('--steps', type=int, default=8, help='steps compared one by one')
    parser.add_argument('--epochs', type=float, default=1.0, help='epochs of the training compared')
    parser.add_argument('--precision', choices=['auto', 'bf16', 'fp32'], default='auto',
                        help="auto: our scripts' choice on this CPU")


def main():
    args = equivalence.parse_args(__doc__, 'cifar10_speedrun.py',
                                  add_arguments)
    global PRECISION
    PRECISION = resolve_device_precision('cpu', args.precision)[1]
    data_dir = os.path.abspath(args.data_dir)
    published = load_published(os.path.abspath(args.script), args.epochs)
    equivalence.enter_workdir(data_dir, args.workdir)  # the published script reads ./cifar10/
    data = load_study_data('cifar10', data_dir)
    torch.manual_seed(0)
    network, gradients = same_networks(published)
    print(json.dumps(network), flush=True)
    with torch.random.fork_rng(devices=[]):  # the later checks draw as they did without it
        print(json.dumps(same_fp16_recipe(published)), flush=True)
    train_loader = published['CifarLoader']('cifar10', train=True)
    images = train_loader.normalize(train_loader.images[:ours.hyp['net']['whiten_images']])
    print(json.dumps(same_whitening(published, images)), flush=True)
    print(json.dumps(same_jitter(published, torch.randn(2000, 3, 32, 32))), flush=True)
    total_steps = round(args.epochs * 32)
    print(json.dumps(same_orthogonalization(published, gradients, total_steps)), flush=True)
    training, kept = same_training(published, data, args.epochs, args.steps)
    for result in training:
        print(json.dumps(result), flush=True)
    test_images = kept['normalize'](published['CifarLoader']('cifar10', train=False).images)
    print(json.dumps(same_selective_tta(published, kept['final'], test_images)), flush=True)


if __name__ == '__main__':
    main()
