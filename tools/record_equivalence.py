"""Check, piece by piece, that airbench96_faster.py computes what the published record computes when
both start from the same weights and see the same batches, on this CPU in our precision.

A side by side of whole runs compares two random samples; at the few epochs a CPU affords, runs of
either script differ by points, so it cannot find a small difference. This tool removes the
randomness instead: it loads the record's definitions as tools/reference.py does (CUDA redirected
to the CPU, bf16 autocast) and compares, bitwise where the arithmetic is the same:
- the networks (main and proxy): parameter names, which are trained, the logits, the gradients and
  the BatchNorm statistics of one training step, and the logits in evaluation mode;
- the whitening filters from the same images (equal up to each eigenvector's sign, which eigh does
  not fix; a flipped filter swaps two channels of [W, -W], the same network up to their order);
- the optimizer: each group's lr and weight decay, then --steps steps of the main network on the
  record's own batches and masks (its loader, its proxy's selection), the record's way (its
  LambdaLR schedule, its Lookahead state) against ours (lr_schedule, our LookaheadState): the
  largest difference of any state entry after each step;
- the proxy's selection: the record's train_proxy against our select_hardest, from the same
  initial weights on the record's batches: the same examples in every batch.
With --whole-run E, also whole runs of E epochs: the record's own main() (its seed fixed through
Python's random, which it draws from) against our train() started from the record's initial
weights of both networks and its whitening filters, fed the record's stream of batches (its
loader, seeded with the run's data seed), with the record's rounding of two scalars per step (its
lr multipliers' formula, its float32 Lookahead decays: ours differ in the last bits, which the
comparison of steps measures): the TTA accuracies and the final weights. One known difference is
removed for it: the record copies its network for Lookahead before the whitening
init, so its first Lookahead update moves the frozen whitening filters back toward their random
initialization by a fraction 0.95**5 * (5 / steps)**3 (1.1e-4 at 96 steps, 1e-8 at the 2160 of
45 epochs); ours copies after. Here the record's network is whitened before that copy too (its
own init then whitens it again, to the same filters).
Not compared: the two loaders' random draws (the record seeds torch's global generator per epoch,
ours draws from one generator per source), which give different batches by design; their
batches' statistics are alike.

Usage: python tools/record_equivalence.py PATH/airbench96_faster.py --data-dir DIR [--steps 12]
           [--whole-run E]
Prints one JSON line per check and exits with 1 if any differs.
"""
import json
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import equivalence  # noqa: E402  (tools/equivalence.py)
import reference  # noqa: E402  (tools/reference.py)
import airbench96_faster as ours  # noqa: E402
from equivalence import CPU, largest_difference, snapshot  # noqa: E402
from studylib.data import load_study_data  # noqa: E402

BF16 = torch.autocast('cpu', dtype=torch.bfloat16)


def load_record(path, epochs):
    """The record's definitions, its CUDA calls on the CPU and its networks in bf16 autocast."""
    record = equivalence.load_published(path, 'record')
    make_net = record['make_net']
    def make_net_in_bf16(arch):
        net = make_net(arch)
        net.forward = reference.in_precision(net.forward, True)
        return net
    record['make_net'] = make_net_in_bf16
    record['hyp']['opt']['train_epochs'] = epochs
    return record


def same_networks(record, arch):
    """Ours with the record's initial weights: one training step and one evaluation, bitwise."""
    theirs = record['make_net'](record['hyp'][arch])
    record['reinit_net'](theirs)
    mine = ours.build_net(ours.hyp[arch], 10, CPU, 'bf16')
    mine.load_state_dict(theirs.state_dict())
    inputs, labels = torch.randn(256, 3, 32, 32), torch.randint(10, (256,))
    step = equivalence.one_training_step(theirs, mine, inputs, labels, 0.2, BF16)
    trained = [[name for name, p in net.named_parameters() if p.requires_grad]
               for net in (theirs, mine)]
    return dict(check=f'{arch} network',
                same_names=list(theirs.state_dict()) == list(mine.state_dict()),
                same_trained=trained[0] == trained[1],
                **{k: step[k] for k in ('logits', 'gradients', 'batchnorm_statistics',
                                        'eval_logits')})


def same_whitening(record, images):
    theirs = record['make_net'](record['hyp']['net'])
    record['init_whitening_conv'](theirs[0], images)
    mine = ours.build_net(ours.hyp['net'], 10, CPU, 'bf16')
    ours.init_whitening(mine[0], images, ours.hyp['net']['whiten_eps'])
    _, up_to_sign, scale = equivalence.filters_up_to_sign(theirs[0].weight, mine[0].weight)
    return dict(check='whitening filters', largest_difference_up_to_sign=up_to_sign, scale=scale)


def record_stream(record, steps):
    """The record's own first steps: its loader's batches and its proxy's masks (train_proxy),
    with the proxy's initial weights kept so that ours can start from them."""
    batches, loader_class = [], record['InfiniteCifarLoader']
    iterate = loader_class.__iter__
    def keep_batches(loader):
        for item in iterate(loader):
            if len(batches) < steps:
                batches.append((item[1].clone(), item[2].clone()))
            yield item
    loader_class.__iter__ = keep_batches
    proxy = reference.uncompiled(record['make_net'](record['hyp']['proxy']))
    proxy._orig_mod[0].bias.requires_grad = False
    reinit, initial = record['reinit_net'], {}
    def reinit_and_keep(model):
        reinit(model)  # train_proxy's model is the compiled one: its module is ._orig_mod
        initial.update(snapshot(model._orig_mod))
    record['reinit_net'] = reinit_and_keep
    masks = record['train_proxy'](record['hyp'], proxy, 12345)
    record['reinit_net'], loader_class.__iter__ = reinit, iterate
    whitening = snapshot(proxy._orig_mod[0])
    return batches, masks, initial, whitening


def our_optimizer(net):
    opt = ours.hyp['opt']
    groups = ours.decoupled_sgd_groups(net, opt['lr'], opt['weight_decay'], opt['momentum'],
                                       opt['batch_size'], opt['bias_scaler'])
    return torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)


def our_schedule(total_steps):
    opt = ours.hyp['opt']
    return ours.lr_schedule(total_steps, peak_fraction=opt['lr_peak_fraction'], end=opt['lr_end'])


def same_selection(record, batches, masks, initial, whitening):
    opt = ours.hyp['opt']
    proxy = ours.build_net(ours.hyp['proxy'], 10, CPU, 'bf16')
    proxy.load_state_dict(initial)
    proxy[0].load_state_dict(whitening)  # the record whitens after its reinit
    proxy[0].bias.requires_grad = False
    selections = ours.select_hardest(proxy, our_optimizer(proxy), iter(batches), len(masks),
                                     our_schedule(len(masks)).tolist(),
                                     round(opt['masked_fraction'] * opt['batch_size']),
                                     ours.hyp['proxy']['step_every'], opt['label_smoothing'], BF16)
    same = [torch.equal(mask.nonzero().flatten(), chosen)
            for mask, chosen in zip(masks, selections)]
    return dict(check='proxy selection', batches=len(same), same_selection=sum(same))


def record_get_lr(total_steps):
    """The record's lr multiplier of a step, its arithmetic."""
    def get_lr(step):
        warmup_steps = int(total_steps * 0.1)
        if step < warmup_steps:
            frac = step / warmup_steps
            return 0.2 * (1 - frac) + 1.0 * frac
        return (total_steps - step) / (total_steps - warmup_steps)
    return get_lr


def record_decays(total_steps):
    """The record's Lookahead decays, in its float32 (ours are float64)."""
    return 0.95**5 * (torch.arange(total_steps + 1) / total_steps)**3


def record_optimizer(record, net, total_steps):
    """The record's main() optimizer and schedule, as its code builds them."""
    opt = record['hyp']['opt']
    kilostep_scale = 1024 * (1 + 1 / (1 - opt['momentum']))
    lr, wd = opt['lr'] / kilostep_scale, opt['weight_decay'] * opt['batch_size'] / kilostep_scale
    lr_biases = lr * opt['bias_scaler']
    groups = [dict(params=[p for k, p in net.named_parameters() if 'norm' in k],
                   lr=lr_biases, weight_decay=wd / lr_biases),
              dict(params=[p for k, p in net.named_parameters() if 'norm' not in k],
                   lr=lr, weight_decay=wd / lr)]
    optimizer = torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, record_get_lr(total_steps))


def same_training(record, batches, masks, total_steps):
    """The record's steps against ours, twice: with our schedule and decays as computed, and with
    the record's rounding of those two scalars (which should leave no difference at all)."""
    theirs = record['make_net'](record['hyp']['net'])
    record['reinit_net'](theirs)
    record['init_whitening_conv'](theirs[0], batches[0][0][:500])
    mine, mine_rounded = (ours.build_net(ours.hyp['net'], 10, CPU, 'bf16') for _ in range(2))
    for net in (mine, mine_rounded):
        net.load_state_dict(theirs.state_dict())
    their_optimizer, scheduler = record_optimizer(record, theirs, total_steps)
    my_optimizers = [our_optimizer(net) for net in (mine, mine_rounded)]
    groups = [[(g['initial_lr'] if 'initial_lr' in g else g['lr'], g['weight_decay'])
               for g in optimizer.param_groups] for optimizer in (their_optimizer, *my_optimizers)]
    initial_lrs = [g['lr'] for g in my_optimizers[0].param_groups]
    multipliers = [our_schedule(total_steps).tolist(),
                   [record_get_lr(total_steps)(step) for step in range(total_steps + 1)]]
    decays = [[ours.lookahead_decay(step, total_steps) for step in range(total_steps + 1)],
              record_decays(total_steps).tolist()]
    lookaheads = [record['LookaheadState'](theirs), ours.LookaheadState(mine),
                  ours.LookaheadState(mine_rounded)]
    differences = [[], []]
    for step, ((images, labels), mask) in enumerate(zip(batches, masks)):
        for optimizer, multiplier in zip(my_optimizers, multipliers):
            for group, initial_lr in zip(optimizer.param_groups, initial_lrs):
                group['lr'] = initial_lr * multiplier[step]
        for net, optimizer in zip((theirs, mine, mine_rounded), (their_optimizer, *my_optimizers)):
            net.train()
            with BF16:
                logits = net(images[mask]).float()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(logits, labels[mask], label_smoothing=0.2, reduction='sum').backward()
            optimizer.step()
        scheduler.step()
        if (step + 1) % ours.hyp['opt']['lookahead_every'] == 0:
            lookaheads[0].update(theirs, decay=decays[1][step + 1])
            lookaheads[1].update(mine, decay=decays[0][step + 1])
            lookaheads[2].update(mine_rounded, decay=decays[1][step + 1])
        for found, net in zip(differences, (mine, mine_rounded)):
            found.append(largest_difference(*[n.state_dict().values() for n in (theirs, net)]))
    return dict(check='main network training', same_groups=groups[0] == groups[1] == groups[2],
                steps=total_steps, largest_lr_multiplier_difference=max(
                    abs(a - b) for a, b in zip(*multipliers)),
                largest_decay_difference=max(abs(a - b) for a, b in zip(*decays)),
                largest_state_difference_per_step=differences[0],
                with_the_records_rounding=differences[1])


class RecordStream:
    """Our CifarLoader's interface over the record's loader: every pass is the record's stream of
    (images, labels) for data_seed, from its beginning."""

    def __init__(self, loader_class, data_seed, batch_size, aug):
        self.loader = loader_class('cifar10', train=True, batch_size=batch_size, aug=aug,
                                   aug_seed=data_seed, order_seed=data_seed)
        self.images, self.batch_size = self.loader.images, batch_size

    def normalize(self, images):
        return self.loader.normalize(images)

    def __len__(self):
        return len(self.images) // self.batch_size

    def __iter__(self):
        return ((images, labels) for _, images, labels in self.loader)


def record_run(record, seed):
    """The record's main() for one run: (its TTA accuracy, its final main network, what ours needs
    to start where it started: initial weights by network, whitening filters, data seed)."""
    hyp, make_net = record['hyp'], record['make_net']
    proxy, net, frozen = (reference.uncompiled(make_net(hyp[arch]))
                          for arch in ('proxy', 'net', 'net'))
    proxy._orig_mod[0].bias.requires_grad = frozen._orig_mod[0].bias.requires_grad = False
    start, reinit, whiten = {}, record['reinit_net'], record['init_whitening_conv']
    loader_class = record['InfiniteCifarLoader']
    T_normalize = loader_class('cifar10', train=False).normalize

    def reinit_and_keep(model):
        reinit(model)
        name = 'net' if model is net else 'proxy'
        start[name] = snapshot(model._orig_mod)
        if model is net:  # whitened before main() copies it for Lookahead (see the docstring)
            images = loader_class('cifar10', train=True).images[:5000]
            whiten(model._orig_mod[0], T_normalize(images))

    def whiten_and_keep(layer, images, eps=5e-4):
        whiten(layer, images, eps)
        start.setdefault('whitening', layer.weight.detach().clone())

    class KeepSeed(loader_class):
        def __init__(self, *args, aug_seed=None, **kwargs):
            super().__init__(*args, aug_seed=aug_seed, **kwargs)
            if aug_seed is not None:
                start['data_seed'] = aug_seed

    record.update(reinit_net=reinit_and_keep, init_whitening_conv=whiten_and_keep,
                  InfiniteCifarLoader=KeepSeed)
    random.seed(seed)  # the record draws its init and data seeds from Python's random
    accuracy = record['main'](seed, hyp, proxy, net, frozen)
    record.update(reinit_net=reinit, init_whitening_conv=whiten, InfiniteCifarLoader=loader_class)
    return accuracy, net._orig_mod, start


def our_run(record, data_dir, epochs, start):
    """Our train() from the record's start (see record_run), on the record's stream, with the
    record's rounding of the lr multipliers and Lookahead decays (same_training measures it)."""
    def reinitialize_from(net, whiten=True, identity_init=True):
        reinitialize(net, whiten, identity_init)  # our flags, then the record's weights
        net.load_state_dict(start['net' if net[2].residual else 'proxy'])

    def whitening_from(layer, images, eps):
        with torch.no_grad():
            layer.weight.copy_(start['whitening'])
            layer.bias.zero_()

    def stream(images, labels, batch_size, *args, **kwargs):
        return RecordStream(record['InfiniteCifarLoader'], start['data_seed'], batch_size,
                            record['hyp']['aug'])

    def schedule(total_steps, **kwargs):
        return torch.tensor([record_get_lr(total_steps)(step) for step in range(total_steps + 1)],
                            dtype=torch.float64)

    def decay(step, total_steps):
        return record_decays(total_steps)[step].item()

    reinitialize = ours.reinitialize
    with equivalence.stood_in(ours, reinitialize=reinitialize_from, init_whitening=whitening_from,
                              CifarLoader=stream, lr_schedule=schedule, lookahead_decay=decay):
        data = load_study_data('cifar10', data_dir)
        result = ours.train(data, equivalence.with_epochs(ours.hyp, epochs), CPU, 'bf16', seed=0)
    return result['tta_val_acc'], result['net']


def same_run(record, data_dir, epochs):
    their_accuracy, theirs, start = record_run(record, seed=0)
    my_accuracy, mine = our_run(record, data_dir, epochs, start)
    differences, largest = equivalence.entry_differences(theirs.state_dict(), mine.state_dict())
    return dict(check=f'whole run of {epochs:g} epochs', record_tta_accuracy=their_accuracy,
                our_tta_accuracy=my_accuracy, final_state_entries=len(differences),
                entries_that_differ=sum(d > 0 for d in differences.values()),
                largest_final_state_difference=differences[largest], in_entry=largest,
                whose_largest_value=theirs.state_dict()[largest].float().abs().max().item())


def add_arguments(parser):
    parser.add_argument('--steps', type=int, default=12, help='steps of the stream compared')
    parser.add_argument('--whole-run', type=float, metavar='E',
                        help='also one whole run of E epochs of each, from the same start')


def main():
    args = equivalence.parse_args(__doc__, 'airbench96_faster.py',
                                  add_arguments)
    data_dir = os.path.abspath(args.data_dir)
    steps_per_epoch = 50000 // ours.hyp['opt']['batch_size']
    record = load_record(os.path.abspath(args.script), args.steps / steps_per_epoch)
    equivalence.enter_workdir(data_dir, args.workdir)  # the record reads ./cifar10/
    torch.manual_seed(0)
    random.seed(0)  # the record's train_proxy seeds its initialization from Python's random
    batches, masks, initial, whitening = record_stream(record, args.steps)
    results = [same_networks(record, 'net'), same_networks(record, 'proxy'),
               same_whitening(record, batches[0][0][:500]),
               same_selection(record, batches, masks, initial, whitening),
               same_training(record, batches, masks, len(masks))]
    for result in results:
        print(json.dumps(result), flush=True)
    exact = [r['logits'] == r['gradients'] == r['batchnorm_statistics'] == r['eval_logits'] == 0
             and r['same_names'] and r['same_trained'] for r in results[:2]]
    training = results[4]
    exact += [results[2]['largest_difference_up_to_sign'] < 1e-2 * results[2]['scale'],
              results[3]['same_selection'] == results[3]['batches'],
              training['same_groups'] and max(training['with_the_records_rounding']) == 0]
    if args.whole_run:
        record['hyp']['opt']['train_epochs'] = args.whole_run
        results.append(same_run(record, data_dir, args.whole_run))
        print(json.dumps(results[-1]), flush=True)
        exact.append(results[-1]['record_tta_accuracy'] == results[-1]['our_tta_accuracy'])
    print(json.dumps({'equivalent': all(exact), 'steps': args.steps}))
    sys.exit(0 if all(exact) else 1)


if __name__ == '__main__':
    main()
