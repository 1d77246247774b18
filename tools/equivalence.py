"""What tools/record_equivalence.py and tools/hiverge_equivalence.py share: the published script
loaded on this CPU (its definitions run as tools/reference.py runs them), their command line, the
differences they measure between its networks and ours, and our train() run with some of its
functions stood in for (the published run's weights, filters and batches).
"""
import argparse
import contextlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (tools/reference.py)

CPU = torch.device('cpu')


def parse_args(doc, published, add_arguments):
    """The command line (described by doc's first paragraph): the published script and the data,
    the tool's own flags (add_arguments(parser)), then the directory the published script runs
    in."""
    parser = argparse.ArgumentParser(description=' '.join(doc.split('\n\n')[0].split()))
    parser.add_argument('script', help=f'the published {published} (tools/reference.py says where '
                        'to get it)')
    parser.add_argument('--data-dir', required=True, help="CIFAR-10 as our scripts' --data-dir")
    add_arguments(parser)
    parser.add_argument('--workdir', default='/tmp/airbench-reference')
    return parser.parse_args()


def load_published(path, name, edit=lambda source: source):
    """The published script's definitions (all but its main block; `edit` may change its source
    first), run with its CUDA calls on the CPU: a namespace of its functions, classes and hyp."""
    with open(path) as f:
        definitions, _, _, _ = reference.split_script(edit(f.read()), path)
    reference.redirect_cuda_to_cpu()
    namespace = {'__name__': name}
    exec(compile(definitions, path, 'exec'), namespace)
    return namespace


def enter_workdir(data_dir, workdir):
    """Write the data where the published script reads it (./cifar10/ of workdir) and go there."""
    reference.write_script_cache(data_dir, workdir)
    os.chdir(workdir)


def snapshot(module):
    """A copy of a module's state as it is now."""
    return {k: v.clone() for k, v in module.state_dict().items()}


def largest_difference(tensors, others):
    """The largest absolute difference between corresponding tensors; lists of different lengths,
    or empty ones, raise: a check must not pass on nothing."""
    return max((a.float() - b.float()).abs().max().item()
               for a, b in zip(tensors, others, strict=True))


def entry_differences(theirs, mine):
    """Per entry of two state dicts with the same names, the largest absolute difference; and the
    entry where it is largest."""
    differences = {name: (t.float() - mine[name].float()).abs().max().item()
                   for name, t in theirs.items()}
    return differences, max(differences, key=differences.get)


def one_training_step(theirs, mine, inputs, labels, label_smoothing, autocast):
    """Both networks (the same weights) through one training step on one batch, then evaluated
    on it: the largest differences of their logits, loss, gradients, BatchNorm statistics and
    evaluation logits."""
    logits, losses = [], []
    for net in (theirs, mine):
        net.train()
        with autocast:
            logits.append(net(inputs).float())
        losses.append(F.cross_entropy(logits[-1], labels, label_smoothing=label_smoothing,
                                      reduction='sum'))
        losses[-1].backward()
    with torch.no_grad(), autocast:
        eval_logits = [net.eval()(inputs).float() for net in (theirs, mine)]
    gradients = [[p.grad for p in net.parameters() if p.grad is not None] for net in (theirs, mine)]
    return dict(logits=largest_difference(*[[t] for t in logits]),
                loss=abs(losses[0].item() - losses[1].item()),
                gradients=largest_difference(*gradients),
                batchnorm_statistics=largest_difference(*[list(net.buffers())
                                                          for net in (theirs, mine)]),
                eval_logits=largest_difference(*[[t] for t in eval_logits]))


def filters_up_to_sign(theirs, mine):
    """Two whitening layers' filters compared up to each filter's sign, which eigenvectors do not
    fix (a flipped filter swaps two channels of [W, -W]: the same network up to their order): the
    filters flipped, the largest difference, and the filters' scale."""
    a, b = theirs.flatten(1), mine.flatten(1)
    flipped = ((a + b).abs().amax(1) < (a - b).abs().amax(1)).sum().item()
    up_to_sign = torch.minimum((a - b).abs().amax(1), (a + b).abs().amax(1)).max().item()
    return flipped, up_to_sign, a.abs().max().item()


@contextlib.contextmanager
def stood_in(module, **stand_ins):
    """Within the block, module's attributes of these names are the stand-ins; after it, their
    own."""
    saved = {name: getattr(module, name) for name in stand_ins}
    for name, stand_in in stand_ins.items():
        setattr(module, name, stand_in)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


def with_epochs(hyp, epochs):
    """A copy of hyp whose schedule is `epochs` long."""
    return {**hyp, 'opt': {**hyp['opt'], 'train_epochs': epochs}}
