"""airbench94_hiverge.py: CIFAR-10 to 94% in the least time known: the Muon record, hiverge's way.

Method: hiverge/cifar10-speedrun (github.com/hiverge/cifar10-speedrun, commit 06c6072, MIT), the
fastest published 94% method, which the airbench authors' README links as the record. It is
airbench94_muon's method retuned: the same 1,972,792-parameter network (SiLU in its blocks) trained
by Muon on the 3x3 filters and Nesterov SGD on the rest, for 245 steps of 1536 images, with a
brightness and contrast jitter, and six-view TTA spent only on the least confident quarter of the
test set. Training costs 0.263 PFLOPs as tools/flops.py counts them (airbench94_muon: 0.291).

Evidence: NVIDIA A100-SXM4-80GB (the published script, RunPod, torch 2.4.0): 94.02% mean TTA
accuracy, n=2000, 1.98 s per run. CPUs, CIFAR-10 re-encoded as JPEG: docs/cpu.md's results (n,
host, command), beside the published script. Timed as in the paper: from the first touch of
training data (whitening init) to the test predictions (after TTA).

Changes relative to airbench94_muon.py (line by line, with the published values: docs/layout.md):
its hyp retuned (batch 1536, 7.65 epochs, Muon's filters decayed too), a brightness and contrast
jitter, SiLU in the blocks, whitening from 960 images, the six filter banks orthogonalized at once
and renormalized only every few steps, TTA for the least confident quarter of the test set, and on
CUDA every layer in fp16, BatchNorm too.
Compiled and timed as airbench94_muon is: on CUDA the network with its loss, Muon's whole step (its
lr and renormalization as tensors) and the augmentation (the jitter too), one timing window.

Run: python airbench94_hiverge.py --runs 25 --data-dir data/cifar10 (see --help).
"""
import time
from math import ceil, inf

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------- Hyperparameters -----------------------------------------
hyp = {
    'opt': {
        'train_epochs': 7.65,       # epochs; a fractional last epoch stops mid-epoch
        'batch_size': 1536,         # examples per step; the last partial batch is dropped
        'filter_lr': 0.205,         # Muon: step per 3x3 filter bank, orthogonalized (see Muon)
        'filter_momentum': 0.655,   # Muon's Nesterov momentum
        'newton_schulz_steps': 3,   # iterations that orthogonalize each filter update
        'renorm_every': (2, 17),    # steps between filter renormalizations, first to last step
        'head_lr': 0.5415,          # SGD learning rate of the linear head, per step
        'bias_lr': 0.0573,          # SGD learning rate of the BatchNorm and whitening biases
        'momentum': 0.825,          # SGD's Nesterov momentum
        'weight_decay': 1.0418e-6,  # weight fraction decayed per example, x lr for Muon's filters
        'label_smoothing': 0.09,    # of the cross-entropy, which is summed over the batch
        'whiten_bias_epochs': 0.2,  # epochs (rounded up to whole steps) of whitening-bias training
    },
    'aug': {
        'flip': 'alternating',      # 'alternating' (the paper's), 'random' (coin per epoch), 'none'
        'translate': 2,             # pixels of reflect padding before a random 32x32 crop
        'brightness': 0.1399,       # per image, a uniform shift in +-this of the normalized values
        'contrast': 0.1308,         # then a uniform scale in 1 +- this; both 0: no jitter
    },
    'net': {
        'widths': {'block1': 64, 'block2': 256, 'block3': 256},   # output channels per block
        'batchnorm_momentum': 0.5566,  # running = 0.5566 * running + 0.4434 * batch statistic
        'scaling_factor': 1 / 256,  # the logits are multiplied by this: 1 / the head's width
        'whiten_images': 960,       # first training images whose patches set the whitening
        'whiten_eps': 5e-4,         # added to the patch eigenvalues before the inverse square root
        'tta_level': 2,             # 0: plain, 1: mirror, 2: mirror and two one-pixel translations
        'tta_fraction': 0.25,       # of the test images, the least confident get TTA; 1: all
        'compile_mode': 'max-autotune',  # torch.compile's mode for the network on CUDA
    },
}

# The values hyp takes: each switch's choices, each number's inclusive range (widths and a
# tuple: each element's); a number in neither keeps the sign of hyp's. study.py refuses any other
# value before training (python study.py SCRIPT ... -- --hyp KEY=VALUE).
HYP_CHOICES = {
    'aug.flip': ('alternating', 'random', 'none'),
    'net.tta_level': (0, 1, 2),
    'net.compile_mode': ('max-autotune', 'max-autotune-no-cudagraphs', 'reduce-overhead',
                         'default'),
}
HYP_RANGES = {
    'opt.train_epochs': (0.001, inf),
    'opt.batch_size': (1, inf),
    'opt.filter_momentum': (0, 0.999),
    'opt.newton_schulz_steps': (1, inf),
    'opt.renorm_every': (1, inf),
    'opt.momentum': (0, 0.999),
    'opt.label_smoothing': (0, 1),
    'aug.translate': (0, 31),
    'net.widths': (1, inf),
    'net.batchnorm_momentum': (0, 1),
    'net.whiten_images': (1, inf),
    'net.tta_fraction': (0, 1),
}

# ----------------------------------- Augmentation and the loader ----------------------------------
# An epoch's augmentation is arithmetic on the whole training set from a few random draws per image.
# The draws come eagerly from the loader's generator (compiled code draws from no torch.Generator);
# the arithmetic is one function, compiled where the network is (fused into a pass or two).
def compiled_per_image(function):
    """function under torch.compile, with static shapes but for its tensor arguments' first
    dimension, one per image: the warmup's few images and a run's training set share its graph."""
    compiled = torch.compile(function, dynamic=False)

    def call(*args):
        for arg in args:
            if isinstance(arg, torch.Tensor):
                torch._dynamo.mark_dynamic(arg, 0)
        return compiled(*args)
    return call

def coin_flips(n, device, generator=None):
    """n fair coin flips: True mirrors that image."""
    return torch.rand(n, device=device, generator=generator) < 0.5

def prepared_images(images, mean, std, mirror, pad):
    """The first epoch's work, kept for the later ones: the images normalized, those where mirror
    is True (None: none) mirrored left-right, and reflect-padded by pad pixels (0: none)."""
    images = (images - mean) / std
    if mirror is not None:
        images = torch.where(mirror.view(-1, 1, 1, 1), images.flip(-1), images)
    return F.pad(images, (pad,) * 4, mode='reflect') if pad > 0 else images

def augmented_images(padded_images, crop_size, shifts, mirror, brightness_draws, contrast_draws,
                     brightness, contrast):
    """An epoch's images: each cropped from the padded ones with its corner at shifts (y, x) (None:
    not padded), mirrored left-right where mirror is True, then shifted by (2 u - 1) brightness
    and scaled by 1 + (2 v - 1) contrast for its uniform draws u, v (None: no jitter)."""
    images = padded_images
    if shifts is not None:
        # windows[i, c, y, x]: image i's crop_size x crop_size window with its corner at (y, x)
        windows = padded_images.unfold(2, crop_size, 1).unfold(3, crop_size, 1)
        each = torch.arange(len(images), device=images.device)
        images = windows[each, :, shifts[:, 0], shifts[:, 1]]
    images = torch.where(mirror.view(-1, 1, 1, 1), images.flip(-1), images)
    if brightness_draws is not None:
        offsets = (brightness_draws * 2 - 1) * brightness
        scales = (contrast_draws * 2 - 1) * contrast + 1
        images = (images + offsets) * scales
    return images

class CifarLoader:
    """Random batches (the last partial one dropped) of images held on the device, augmented an
    epoch at a time; order and augmentation each from its own generator (None: torch's default).
    Alternating flip: epoch 0 mirrors a random half of the images; then each epoch the others;
    after the flip each image gets its own brightness and contrast jitter, anew every epoch.
    compiled: the later epochs' arithmetic under torch.compile (compiled_per_image)."""

    def __init__(self, images, labels, batch_size, mean, std, aug, dtype=torch.float32,
                 order_generator=None, aug_generator=None, sampling='reshuffle', compiled=False):
        self.images = images.permute(0, 3, 1, 2).to(dtype) / 255  # uint8 NHWC -> [0, 1] NCHW
        self.labels = labels
        self.batch_size = batch_size
        self.aug = aug
        self.sampling = sampling
        self.order_generator = order_generator
        self.aug_generator = aug_generator
        self.epoch = 0
        self.mean = torch.tensor(mean, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.padded_images = None  # normalized, pre-flipped and reflect-padded in the first epoch
        self.augment = compiled_per_image(augmented_images) if compiled else augmented_images

    def normalize(self, images):
        return (images - self.mean) / self.std

    def __len__(self):
        return len(self.images) // self.batch_size

    def augmented_epoch(self):
        """The epoch's images; the draws in the order of the arithmetic (flip, crop, jitter)."""
        flip = self.aug['flip']
        pad = self.aug['translate']
        n = len(self.images)
        device = self.images.device
        generator = self.aug_generator
        if self.padded_images is None:
            first_mirror = coin_flips(n, device, generator) if flip == 'alternating' else None
            self.padded_images = prepared_images(self.images, self.mean, self.std, first_mirror,
                                                 pad)
        shifts = None
        if pad > 0:
            shifts = torch.randint(2 * pad + 1, (n, 2), device=device, generator=generator)
        if flip == 'random':
            mirror = coin_flips(n, device, generator)
        else:  # alternating: pre-flipped in the first epoch, all mirrored back in every odd one
            mirrored_back = flip == 'alternating' and self.epoch % 2 == 1
            mirror = torch.full((n,), mirrored_back, device=device)
        brightness = self.aug['brightness']
        contrast = self.aug['contrast']
        brightness_draws = None
        contrast_draws = None
        if brightness > 0 or contrast > 0:
            draw = dict(device=device, dtype=self.images.dtype, generator=generator)
            brightness_draws = torch.rand(n, 1, 1, 1, **draw)
            contrast_draws = torch.rand(n, 1, 1, 1, **draw)
        return self.augment(self.padded_images, self.images.size(-1), shifts, mirror,
                            brightness_draws, contrast_draws, brightness, contrast)

    def __iter__(self):
        images = self.augmented_epoch()
        self.epoch += 1
        n = len(images)
        draw = dict(device=images.device, generator=self.order_generator)
        indices = (torch.randint(n, (n,), **draw) if self.sampling == 'replacement'  # N draws
                   else torch.randperm(n, **draw))
        for batch in indices[:len(self) * self.batch_size].split(self.batch_size):
            yield images[batch], self.labels[batch]

# -------------------------------------------- Network ---------------------------------------------

class Mul(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale

class BatchNorm(nn.BatchNorm2d):
    """Scale frozen at 1. Momentum m: running = m * running + (1 - m) * batch (PyTorch's 1 - m)."""

    def __init__(self, num_features, momentum, eps=1e-12):
        super().__init__(num_features, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad = False

def conv3x3(channels_in, channels_out):
    return nn.Conv2d(channels_in, channels_out, kernel_size=3, padding='same', bias=False)

class ConvGroup(nn.Module):
    def __init__(self, channels_in, channels_out, batchnorm_momentum):
        super().__init__()
        self.conv1 = conv3x3(channels_in, channels_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = BatchNorm(channels_out, batchnorm_momentum)
        self.conv2 = conv3x3(channels_out, channels_out)
        self.norm2 = BatchNorm(channels_out, batchnorm_momentum)
        self.activ = nn.SiLU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))

def init_identity(net):
    """The first M filters of each 3x3 conv with M inputs become the identity; the rest stay."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (3, 3):
            nn.init.dirac_(module.weight[:module.weight.size(1)])  # in place, without autograd

def make_net(widths, num_classes, batchnorm_momentum, scaling_factor, whiten_kernel_size=2):
    """2x2 whitening conv (31x31 maps) -> three blocks (15, 7, 3) -> 3x3 max-pool -> linear -> x
    scale, initialized by reinitialize; the whitening weights are set from the data, not trained."""
    whiten_width = 2 * 3 * whiten_kernel_size**2
    net = nn.Sequential(
        nn.Conv2d(3, whiten_width, whiten_kernel_size, padding=0, bias=True),
        nn.GELU(),
        ConvGroup(whiten_width, widths['block1'], batchnorm_momentum),
        ConvGroup(widths['block1'], widths['block2'], batchnorm_momentum),
        ConvGroup(widths['block2'], widths['block3'], batchnorm_momentum),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(widths['block3'], num_classes, bias=False),
        Mul(scaling_factor),
    )
    net[0].weight.requires_grad = False
    reinitialize(net)
    return net

def reinitialize(net):
    """A network from make_net as if built anew (fresh default init, identity init, the head at unit
    standard deviation, whitening bias trainable): one built or compiled network serves all runs."""
    for module in net.modules():
        if hasattr(module, 'reset_parameters'):  # PyTorch's default init of each layer
            module.reset_parameters()
    init_identity(net)
    with torch.no_grad():  # the logits are divided by its width: at first the scale of 1/9
        net[-2].weight /= net[-2].weight.std()
    net[0].bias.requires_grad = True

def compiles(device):
    """Whether the network (in training with its loss), Muon's step and the augmentation are
    compiled: on CUDA, as the record compiles; not on the CPU, where inductor's code was slower
    than eager (docs/cpu.md, "Speed")."""
    return device.type == 'cuda'

def compile_alike_on_every_torch():
    """The same graphs from torch 2.4 on (docs/tests.md, "Torch versions"). A new graph when a
    parameter's requires_grad changes (the whitening bias's freeze), as torch 2.5, 2.6 and 2.12 on
    make by default; 2.4 and 2.7 to 2.11 would reuse the graph that computes the frozen bias's
    gradient (pytorch/pytorch#139476). On 2.4, without inductor's rewrite of a scaled softmax,
    which fails on a graph that also returns the scaled logits (pytorch/pytorch#129685)."""
    if torch.__version__ < '2.5':
        torch._dynamo.config.inline_inbuilt_nn_modules = True
        from torch._inductor.fx_passes import joint_graph
        for entries in joint_graph.pass_patterns[1].patterns.values():
            entries[:] = [entry for entry in entries
                          if getattr(entry, 'handler', None) is not joint_graph.mul_softmax_pattern]
    elif '2.7' <= torch.__version__ < '2.12':
        torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags = False

def with_loss(forward):
    """A network's forward (images to logits) that, given labels, also returns the logits'
    label-smoothed cross-entropy in fp32, summed over the batch: the training step's loss, in the
    network's graph where the network is compiled (not run eagerly after it)."""
    def forward_and_loss(inputs, labels=None, label_smoothing=0.0):
        outputs = forward(inputs)
        if labels is None:
            return outputs
        loss = F.cross_entropy(outputs.float(), labels, label_smoothing=label_smoothing,
                               reduction='sum')
        return outputs, loss
    return forward_and_loss

def build_net(arch, num_classes, device, precision):
    """make_net from hyp['net'], on the device in a precision recipe, channels_last. 'fp16': the
    CUDA recipe, every layer in fp16 as published: weights and activations, BatchNorm's
    parameters and running statistics too (airbench94_muon keeps BatchNorm in fp32); 'bf16': fp32
    weights, bf16 autocast (the CPU's); 'fp32'. Compiled where compiles(device): its forward,
    static shapes, in arch['compile_mode'], every graph by the warmup run. Its forward given labels
    also returns the loss (with_loss): one graph for both in training."""
    net = make_net(arch['widths'], num_classes, arch['batchnorm_momentum'], arch['scaling_factor'])
    net = net.to(device=device, memory_format=torch.channels_last)
    if precision == 'fp16':
        # BatchNorm too, as the published CifarNet halves every module. Its eps (1e-12, which is 0
        # in fp16) stays a Python float: on CUDA PyTorch's kernel and inductor's code alike take
        # the batch statistics, var + eps and 1 / std in fp32, and store only the running
        # statistics in fp16 (docs/layout.md)
        net = net.half()
    net.forward = with_loss(net.forward)
    if compiles(device):
        compile_alike_on_every_torch()
        net.forward = torch.compile(net.forward, mode=arch['compile_mode'], dynamic=False)
    return net

# ------------------------------------------- Whitening --------------------------------------------
def whitening_filters(images, kernel_size, eps):
    """Filters whitening the k x k patches of images (N, C, H, W): the eigenvectors of the patches'
    second-moment matrix, largest eigenvalue first, each divided by sqrt(eigenvalue + eps)."""
    patches = images.unfold(2, kernel_size, 1).unfold(3, kernel_size, 1)  # N, C, H', W', k, k
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, images.size(1) * kernel_size**2).float()
    second_moment = patches.T @ patches / len(patches)
    eigenvalues, eigenvectors = (t.flip(-1) for t in torch.linalg.eigh(second_moment))  # descending
    filters = eigenvectors.T / torch.sqrt(eigenvalues + eps).view(-1, 1)
    return filters.reshape(-1, images.size(1), kernel_size, kernel_size)

def init_whitening(layer, images, eps):
    """Set the frozen whitening conv to [W, -W] (the negations keep what the GELU after it would
    drop); its bias keeps its default init and is trained for the first epochs."""
    filters = whitening_filters(images, layer.kernel_size[0], eps)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([filters, -filters]))

# --------------------------------------- Evaluation and TTA ---------------------------------------
EVAL_BATCH_SIZE = 2000  # test images per forward pass

def infer(net, images, tta_level, autocast, batch_size=EVAL_BATCH_SIZE, tta_fraction=1.0):
    """Logits (fp32) for normalized images: plain, but for the tta_fraction of images with the
    lowest top softmax probability (1: all) the mean of TTA's views: level 1, the image and its
    mirror; 2, also it shifted one pixel diagonally each way (reflect padding) and their mirrors.
    No host synchronization: the count is known on the host, topk picks the images on the device."""
    def view_mean(x):
        views = [x]
        if tta_level == 2:
            padded = F.pad(x, (1,) * 4, mode='reflect')
            size = x.size(-1)
            views += [padded[:, :, :size, :size], padded[:, :, 2:, 2:]]
        views = torch.cat([*views, *(view.flip(-1) for view in views)])  # one pass for all
        logits = net(views.contiguous(memory_format=torch.channels_last)).float()
        return logits.view(-1, len(x), logits.size(-1)).mean(0)  # new memory (see CUDA graphs)

    net.eval()
    with torch.no_grad(), autocast:
        logits = torch.cat([net(batch).float().clone() for batch in images.split(batch_size)])
        count = int(len(images) * tta_fraction) if tta_level > 0 else 0
        if count == 0:
            return logits
        least_confident = logits.softmax(1).amax(1).topk(count, largest=False).indices
        # in batches of batch_size * tta_fraction: then N test images and the warmup's batch_size
        # + N % batch_size have batches of the same sizes (none compiles in a timed run)
        chosen = images[least_confident].split(max(1, round(batch_size * tta_fraction)))
        return logits.index_copy(0, least_confident, torch.cat(list(map(view_mean, chosen))))

# ---------------------------------- Muon, SGD groups and schedule ---------------------------------
def orthogonalize(updates, steps):
    """Approximately U V^T for each matrix U S V^T of a batch (B, rows, cols): x <- a x + (b x x^T +
    c (x x^T)^2) x maps each singular value s to a s + b s^3 + c s^5, into a band around 1 in three
    steps (airbench94_muon). Zero rows and columns stay zero: padding changes no matrix's result."""
    a = 3.4576
    b = -4.7391
    c = 2.0843
    x = updates / (updates.norm(dim=(1, 2), keepdim=True) + 1e-7)  # singular values at most 1
    wide = x.size(1) <= x.size(2)
    x = x if wide else x.mT  # iterate with the smaller Gram matrix x x^T
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.mT

def muon_update(weights, grads, momenta, lr, renormalize, momentum, steps, weight_decay, dtype):
    """One Muon step of conv filter banks (out_channels, in_channels, k, k), in place: Nesterov
    momentum; each bank's update flattened to out_channels x (in_channels k k), zero-padded to the
    largest shape, and all orthogonalized at once in dtype; where renormalize (a bool tensor), each
    bank first set to Frobenius norm sqrt(out_channels); then lr (a tensor, or a number) times its
    update off, and a decay by lr weight_decay: in fp32 at least (fp16 would round the decay's
    factor, 1 - 3e-4, to 1 - 5e-4), rounded once to the weights' dtype."""
    torch._foreach_mul_(momenta, momentum)
    torch._foreach_add_(momenta, grads)
    updates = [update.flatten(1) for update in torch._foreach_add(grads, momenta, alpha=momentum)]
    rows = max(update.size(0) for update in updates)
    cols = max(update.size(1) for update in updates)
    padded = torch.stack([F.pad(u, (0, cols - u.size(1), 0, rows - u.size(0))) for u in updates])
    orthogonal = orthogonalize(padded.to(dtype), steps)
    for weight, update, matrix in zip(weights, updates, orthogonal):
        scale = torch.where(renormalize, len(weight)**0.5 / (weight.norm() + 1e-7), 1.0)
        precise = torch.promote_types(weight.dtype, torch.float32)
        change = matrix[:update.size(0), :update.size(1)].reshape_as(weight).to(precise)
        weight.copy_((weight.to(precise) * scale - lr * change) * (1 - lr * weight_decay))

class Muon(torch.optim.Optimizer):
    """Muon for conv filter banks: muon_update at each group's lr, with momentum kept in the
    weights' dtype (fp16 on CUDA, as published). compiled: the whole step under torch.compile, one
    static graph, whose lr and renormalization are tensors (a new value compiles nothing)."""

    def __init__(self, params, lr, momentum, newton_schulz_steps, weight_decay, dtype,
                 compiled=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, steps=newton_schulz_steps,
                                      weight_decay=weight_decay, dtype=dtype))
        self.update = torch.compile(muon_update, dynamic=False) if compiled else muon_update
        for weight in self.param_groups[0]['params']:
            self.state[weight]['momentum'] = torch.zeros_like(weight)

    @torch.no_grad()
    def step(self, renormalize):
        """A step at each group's lr; renormalize: a bool tensor on the weights' device."""
        for group in self.param_groups:
            weights = [weight for weight in group['params'] if weight.grad is not None]
            if not weights:  # frozen banks have no gradient
                continue
            grads = [weight.grad for weight in weights]
            momenta = [self.state[weight]['momentum'] for weight in weights]
            self.update(weights, grads, momenta, group['lr'], renormalize, group['momentum'],
                        group['steps'], group['weight_decay'], group['dtype'])

def optimizer_groups(net, bias_lr, head_lr, weight_decay, batch_size):
    """(Muon's parameters: the 3x3 filters; SGD's groups: the whitening bias, the BatchNorm biases,
    the head). SGD's weight_decay is the decay per step over the group's lr, so that each step
    decays weight_decay * batch_size of a weight at the full lr, whatever the group's lr."""
    trainable = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
    filters = [p for name, p in trainable if p.ndim == 4]
    norm_biases = [p for name, p in trainable if 'norm' in name]
    decay_per_step = weight_decay * batch_size
    return filters, [
        dict(params=[net[0].bias], lr=bias_lr, weight_decay=decay_per_step / bias_lr),
        dict(params=norm_biases, lr=bias_lr, weight_decay=decay_per_step / bias_lr),
        dict(params=[net[-2].weight], lr=head_lr, weight_decay=decay_per_step / head_lr)]

def lr_schedule(total_steps):
    """The lr's multiplier at steps 0..total_steps: linear from 1 down to 0."""
    return [1 - step / total_steps for step in range(total_steps + 1)]

def renormalization_steps(total_steps, first_interval, last_interval):
    """Whether Muon renormalizes at each step: when an interval has passed since the last time (or
    the start), growing from first to last_interval steps with training progress, rounded down."""
    due = []
    last = 0
    for step in range(1, total_steps + 1):  # counted from 1, as the published script counts
        interval = first_interval + int((last_interval - first_interval) * (step / total_steps))
        due.append(step - last >= interval)
        last = step if due[-1] else last
    return due

# -------------------------------------------- Training --------------------------------------------
class DeviceClock:
    """The device's time, marked without making the host wait: on CUDA, which queues the host's
    work, CUDA events in the queue, read once the device has passed them; on the CPU, which works
    as the host asks, the host's clock. Marks alternate: the stretch from each even mark to the
    next is timed, from each odd one to the next is not."""

    def __init__(self, device):
        self.queued = device.type == 'cuda'
        self.marks = []

    def mark(self):
        if self.queued:
            self.marks.append(torch.cuda.Event(enable_timing=True))
            self.marks[-1].record()
        else:
            self.marks.append(time.perf_counter())

    def seconds(self, upto=None):
        """The timed seconds of the first `upto` marks (all by default); on CUDA the host waits
        here until the device has passed the last of them."""
        marks = self.marks[:upto]
        pairs = list(zip(marks[::2], marks[1::2]))
        if not self.queued:
            return sum(stop - start for start, stop in pairs)
        marks[-1].synchronize()
        return sum(start.elapsed_time(stop) for start, stop in pairs) / 1000

def source_seeds(seed):
    """Seeds of the three sources of randomness: initialization, data order, augmentation."""
    seeds = torch.randint(2**62, (3,), generator=torch.Generator().manual_seed(seed)).tolist()
    return dict(zip(('init', 'order', 'aug'), seeds))

def read_figures(figures, total_time_seconds):
    """An epoch's figures, read from the device: the last batch's mean loss and accuracy, the test
    accuracy (None without evaluation) and the timed seconds by the epoch's end."""
    val_acc = figures['val_acc']
    return dict(epoch=figures['epoch'], train_loss=figures['loss'].item() / figures['batch'],
                train_acc=figures['train_acc'].item(),
                val_acc=None if val_acc is None else val_acc.item(),
                total_time_seconds=total_time_seconds)

def train(data, hyp, device, precision, seed, net=None, epoch_eval=True, on_epoch=None):
    """One run, determined by its seed: an int, or the seeds of source_seeds (each source of
    randomness has its own generator, so a study can vary one and hold the others). data: uint8
    images (N, 32, 32, 3) and labels of 'train' and 'test' on the device, 'classes', 'mean', 'std'.
    net: from build_net, reinitialized and trained in place (built when None). on_epoch(figures)
    gets each epoch's figures, untimed: on the CPU as the epoch ends, on CUDA when the run is over
    (it may raise to stop). Returns the run's figures and net."""
    opt = hyp['opt']
    arch = hyp['net']
    batch_size = opt['batch_size']
    epochs = opt['train_epochs']
    dtype = torch.float16 if precision == 'fp16' else torch.float32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=(precision == 'bf16'))
    newton_schulz_dtype = torch.bfloat16 if precision == 'bf16' else dtype  # fp16 as published
    seeds = seed if isinstance(seed, dict) else source_seeds(seed)
    generators = [torch.Generator(device).manual_seed(seeds[key]) for key in ('order', 'aug')]
    train_loader = CifarLoader(data['train']['images'], data['train']['labels'], batch_size,
                               data['mean'], data['std'], hyp['aug'], dtype, *generators,
                               compiled=compiles(device))
    test_images = data['test']['images'].permute(0, 3, 1, 2)
    test_images = train_loader.normalize(test_images.to(dtype) / 255)
    test_labels = data['test']['labels']
    total_steps = ceil(len(train_loader) * epochs)
    whiten_bias_steps = ceil(len(train_loader) * opt['whiten_bias_epochs'])

    if net is None:
        net = build_net(arch, len(data['classes']), device, precision)
    torch.manual_seed(seeds['init'])
    reinitialize(net)
    filters, sgd_groups = optimizer_groups(net, opt['bias_lr'], opt['head_lr'],
                                           opt['weight_decay'], batch_size)
    fused = device.type == 'cuda'  # as published; PyTorch's default implementation on the CPU
    sgd = torch.optim.SGD(sgd_groups, momentum=opt['momentum'], nesterov=True, fused=fused)
    muon = Muon(filters, opt['filter_lr'], opt['filter_momentum'], opt['newton_schulz_steps'],
                opt['weight_decay'] * batch_size, newton_schulz_dtype, compiled=compiles(device))
    initial_lrs = [group['lr'] for group in sgd.param_groups]  # [0]: the whitening bias
    lr_multipliers = lr_schedule(total_steps)
    # Muon's lr and renormalization at every step, as tensors on the device, which the compiled
    # step reads as inputs: a new step's values compile nothing
    muon_lrs = torch.tensor([opt['filter_lr'] * m for m in lr_multipliers], device=device)
    due = renormalization_steps(total_steps, *opt['renorm_every'])
    renormalizations = torch.tensor(due, device=device)

    # Timed: one stretch of the device's time from the whitening init (the first touch of the
    # training data) to the test predictions, with no host synchronization in it (on CUDA each
    # would let the device's queue run dry) but the whitening's eigh (its solver's check, before
    # any training is queued); from each epoch's end to the next one's start (its figures, its
    # evaluation) not timed. The figures stay on the device until read: on CUDA when the run is
    # over, on the CPU (where reading waits for nothing) as each epoch ends.
    clock = DeviceClock(device)
    clock.mark()
    whitening_images = train_loader.normalize(train_loader.images[:arch['whiten_images']])
    init_whitening(net[0], whitening_images, arch['whiten_eps'])

    step = 0
    epoch_figures = []  # each epoch's, on the device
    for epoch in range(ceil(epochs)):
        net.train()
        for inputs, labels in train_loader:
            net[0].bias.requires_grad = step < whiten_bias_steps
            for group, initial_lr in zip(sgd.param_groups, initial_lrs):
                group['lr'] = initial_lr * lr_multipliers[step]
            bias_multiplier = max(0.0, 1 - step / max(1, whiten_bias_steps))
            sgd.param_groups[0]['lr'] = initial_lrs[0] * bias_multiplier
            muon.param_groups[0]['lr'] = muon_lrs[step]
            with autocast:
                outputs, loss = net(inputs, labels, opt['label_smoothing'])
            net.zero_grad(set_to_none=True)
            loss.backward()
            sgd.step()
            muon.step(renormalizations[step])
            step += 1
            if step >= total_steps:
                break

        # Not timed: the last batch's loss (a copy: a CUDA graph's next call overwrites its
        # outputs) and accuracy, and the plain test accuracy
        clock.mark()
        # evaluated with the whitening bias frozen whatever the epoch (the next step
        # sets it again): dynamo guards on requires_grad, so evaluation before the freeze
        # would compile graphs of its own, which no timed part of a run calls
        net[0].bias.requires_grad = False
        figures = dict(epoch=epoch, loss=loss.detach().clone(), batch=len(labels),
                       train_acc=(outputs.detach().argmax(1) == labels).float().mean(),
                       val_acc=None)
        if epoch_eval:
            logits = infer(net, test_images, 0, autocast)
            figures['val_acc'] = (logits.argmax(1) == test_labels).float().mean()
        epoch_figures.append(figures)
        if on_epoch is not None and not clock.queued:
            on_epoch(read_figures(figures, clock.seconds()))
        clock.mark()

    # Timed: test-time augmentation, up to the existence of test predictions
    logits = infer(net, test_images, arch['tta_level'], autocast,
                   tta_fraction=arch['tta_fraction'])
    clock.mark()
    total_time_seconds = clock.seconds()  # on CUDA the host waits here, once, for the whole run
    epochs_read = [read_figures(kept, clock.seconds(2 * kept['epoch'] + 2))
                   for kept in epoch_figures]
    if on_epoch is not None and clock.queued:  # on CUDA: every epoch's figures, now
        for figures in epochs_read:
            on_epoch(figures)
    tta_val_acc = (logits.argmax(1) == test_labels).float().mean().item()
    return dict(seed=seed, seeds=seeds, steps=step, net=net, total_time_seconds=total_time_seconds,
                tta_val_acc=tta_val_acc, val_acc=epochs_read[-1]['val_acc'],
                epoch_train_losses=[figures['train_loss'] for figures in epochs_read])

####################################################################################################
# Running the script: identical in all the airbench scripts, not part of the method. The runs of  #
# one user on one machine; study.py has what many runs need: hyp overrides, intervals, studies.   #
####################################################################################################
import argparse, copy, json, math, os, statistics, sys, torchvision, uuid
from PIL import Image  # torchvision's

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)  # of its training images, per channel, as fractions
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

def read_image(path):
    """uint8 (32, 32, 3); no image, or not 32x32: refused by name (study.py reads with it too)."""
    try:
        with Image.open(path) as image:
            rgb = image.convert('RGB')
    except Exception as error:  # PIL's, which vary with the format and the damage
        raise ValueError(f'{path} could not be read as an image ({error}). Remove or replace '
                         'it.') from None
    if rgb.size != (32, 32):
        raise ValueError(f'{path} is {rgb.size[0]}x{rgb.size[1]} pixels, but these scripts '
                         'train on 32x32 images and do not resize silently. Resize them first.')
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(32, 32, 3)

def read_split(data_dir, split):
    """({'images': uint8 (N, 32, 32, 3), 'labels'}, classes) of data_dir/split/<class>/<image>."""
    path = os.path.join(data_dir, split)
    try:
        folder = torchvision.datasets.ImageFolder(path)  # the files and their classes
    except FileNotFoundError as error:  # no class directories, or a class without images
        raise ValueError(f'{path}: {error} Expected the layout <split>/<class>/<image>.') from None
    images = torch.stack([read_image(file) for file, _ in folder.samples])
    return {'images': images, 'labels': torch.tensor(folder.targets)}, folder.classes

def check_same_classes(data_dir, classes):
    """Refuse splits whose class directories differ; classes: {split: its classes}."""
    first = next(iter(classes))
    for split, names in classes.items():
        if names != classes[first]:
            raise ValueError(f'{data_dir}: {first}/ and {split}/ have different class directories '
                             f'(only in {first}: {sorted(set(classes[first]) - set(names))}; only '
                             f'in {split}: {sorted(set(names) - set(classes[first]))}). All '
                             'splits need the same classes.')

def image_folder_error(data_dir, splits=('train', 'test')):
    """None where data_dir has a directory per split, else the error that says what it lacks."""
    if all(os.path.isdir(os.path.join(data_dir, split)) for split in splits):
        return None
    return ValueError(f'{os.path.abspath(data_dir)} is not in the image-folder layout: it needs '
                      f'the subdirectories {", ".join(s + "/" for s in splits)} each holding one '
                      'directory of 32x32 images per class. Point --data-dir at one.')

def mean_and_std(images):
    """Each channel's mean and std over uint8 images (N, 32, 32, 3), as fractions of 255."""
    pixels = images.reshape(-1, 3).double() / 255
    return tuple(pixels.mean(0).tolist()), tuple(pixels.std(0).tolist())

def load_cifar10(data_dir, download=True):
    """CIFAR-10 in torchvision's layout in data_dir, downloaded there into a directory that is
    absent or empty; one that holds other files is refused (a mistyped path, not a download)."""
    names = os.listdir(data_dir) if os.path.isdir(data_dir) else []
    if names and not {'cifar-10-batches-py', 'cifar-10-python.tar.gz'} & set(names):
        raise image_folder_error(data_dir)
    try:
        sets = [torchvision.datasets.CIFAR10(data_dir, train, download=download)
                for train in (True, False)]
    except Exception as error:  # no files and no network, or damaged files
        raise ValueError(f'No image folder (train/<class>/*, test/<class>/*) nor CIFAR-10 in '
                         f'{os.path.abspath(data_dir)}, nor network access to download it '
                         f'({error}); point --data-dir at one.') from None
    splits = [{'images': torch.from_numpy(s.data), 'labels': torch.tensor(s.targets)} for s in sets]
    return {'train': splits[0], 'test': splits[1], 'classes': sets[1].classes,
            'mean': CIFAR10_MEAN, 'std': CIFAR10_STD}

def load_dataset(data_dir, download=True):
    """{'train': {'images': uint8 (N, 32, 32, 3), 'labels'}, 'test', 'classes', 'mean', 'std'}: the
    image folder data_dir/{train,test}/<class>/<image>, normalized by its training images' own
    mean and std, else CIFAR-10 (load_cifar10)."""
    if image_folder_error(data_dir) is not None:
        return load_cifar10(data_dir, download)
    train, train_classes = read_split(data_dir, 'train')
    test, test_classes = read_split(data_dir, 'test')
    check_same_classes(data_dir, {'train': train_classes, 'test': test_classes})
    mean, std = mean_and_std(train['images'])
    return {'train': train, 'test': test, 'classes': test_classes, 'mean': mean, 'std': std}

def parse_args(argv):
    """The flags one user of one script needs (docs/layout.md says why each); any other flag, or
    a bad value, is refused in one line (main)."""
    script = os.path.basename(__file__)[:-3]
    study = f'python study.py {script} --runs N --study-dir DIR -- --help'
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0], epilog=(
        f'Other hyp values: edit hyp in {script}.py. Many runs, hyp overrides, intervals and '
        f'comparisons: study.py ({study} lists its flags).'), exit_on_error=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add('--runs', type=int, default=25, help='timed training runs')
    add('--seed', type=int, help='seed of the first run; run i uses seed+i (None: random, logged)')
    add('--epochs', type=float, help="hyp's opt.train_epochs (None: as hyp has it)")
    add('--data-dir', default='data/cifar10', help='an image folder (train/<class>/*, '
        "test/<class>/*: 32x32 images), else CIFAR-10 in torchvision's layout (downloaded there)")
    add('--device', help='cpu, cuda, cuda:1, ... (default: CUDA where present)')
    add('--log-dir', default='logs', help='logs go to LOG_DIR/<uuid>/summary.json')
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = ', '.join(action.option_strings[0] for action in parser._actions[1:])
        raise ValueError(f'{script}.py takes {flags}, not {" ".join(unknown)}: for other values '
                         f'edit hyp in {script}.py, or see study.py\'s flags ({study})')
    if args.runs < 1:
        raise ValueError(f'--runs must be at least 1, not {args.runs}')
    if args.epochs is not None and not 0 < args.epochs < math.inf:  # nan too
        raise ValueError(f'--epochs must be above 0, not {args.epochs}')
    return args

def resolve_device(name=None):
    """The torch.device of --device; None: CUDA where present, else the CPU (study.py's auto)."""
    device = torch.device(name or ('cuda' if torch.cuda.is_available() else 'cpu'))
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'--device {device} asks for CUDA, but this torch '
                         f'({torch.__version__}) sees no CUDA device; use --device cpu.')
    return device

def precision_for(device):
    """fp16 on CUDA; on a CPU bf16 autocast where it has native bf16, else fp32 (bf16 without it
    is several times slower). study.py's --precision auto is this."""
    if device.type == 'cuda':
        return 'fp16'
    native_bf16 = device.type == 'cpu' and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return 'bf16' if native_bf16 else 'fp32'

def warm_up(train, data, run_hyp, device, precision, seed, net, full):
    """An untimed run of train on two batches of random labels: full (CUDA, studies), past the
    whitening bias's freeze (a copy may have none), evaluating the whole test set; else 2 steps."""
    opt = run_hyp['opt']
    freeze = math.ceil(opt.get('whiten_bias_epochs', 0)) if full else 0
    epochs = min(freeze + 1, opt['train_epochs'])
    warm = {s: {k: v[:2 * opt['batch_size']] for k, v in data[s].items()} for s in ('train', 'test')}
    warm['train']['labels'] = torch.randint_like(warm['train']['labels'], len(data['classes']))
    train({**data, 'train': warm['train'], 'test': data['test'] if full else warm['test']},
          {**run_hyp, 'opt': {**opt, 'train_epochs': epochs}}, device, precision, seed, net)

def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        device = resolve_device(args.device)
        run_hyp = copy.deepcopy(hyp)
        if args.epochs is not None:
            run_hyp['opt']['train_epochs'] = args.epochs
        data = load_dataset(args.data_dir)
        if len(data['train']['labels']) < run_hyp['opt']['batch_size']:
            raise ValueError(f"{len(data['train']['labels'])} training images make no full "
                             f"batch of {run_hyp['opt']['batch_size']}; lower opt.batch_size.")
    except (ValueError, OSError, RuntimeError, argparse.ArgumentError) as error:  # one line
        sys.exit(f'error: {error}')
    precision = precision_for(device)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), 'little') >> 1
    data.update({s: {k: v.to(device) for k, v in data[s].items()} for s in ('train', 'test')})
    log_dir = f'{args.log_dir}/{uuid.uuid4()}'
    log = dict(argv=argv, hyp=run_hyp, device=str(device), precision=precision, base_seed=seed,
               torch_version=torch.__version__, runs=[], code=open(__file__).read())
    print(f"device {device}, precision {precision}, torch {torch.__version__}, seed {seed}, "
          f"{len(data['train']['labels'])} training images in {len(data['classes'])} classes")
    net = build_net(run_hyp['net'], len(data['classes']), device, precision)
    start = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    warm_up(train, data, run_hyp, device, precision, seed, net, full=device.type == 'cuda')
    log['warmup_seconds'] = time.perf_counter() - start
    columns = 'run epoch train_loss train_acc val_acc tta_val_acc total_time_seconds'.split()
    print(f"warmup: {log['warmup_seconds']:.1f} s\n| {' | '.join(columns)} |")

    def report(figures):
        print('| ' + ' | '.join((f'{figures[c]:.4f}' if isinstance(figures.get(c), float) else
                                 str(figures.get(c, ''))).rjust(len(c)) for c in columns) + ' |')
        if not math.isfinite(figures.get('train_loss', 0)):
            raise FloatingPointError(f"run {figures['run']}: the training loss became "
                                     f"{figures['train_loss']} in epoch {figures['epoch']}. Lower "
                                     "the learning rate (hyp's opt.lr) or check the data.")

    def write_log(status):  # after each run, replaced whole: a crash keeps the runs before it
        os.makedirs(log_dir, exist_ok=True)
        with open(f'{log_dir}/summary.json.tmp', 'w') as f:
            json.dump(dict(log, status=status, runs_finished=len(log['runs'])), f, indent=2)
        os.replace(f'{log_dir}/summary.json.tmp', f'{log_dir}/summary.json')

    try:  # status: set by the last run's log, or by how the runs stopped
        for run in range(args.runs):
            start = time.perf_counter()
            result = train(data, run_hyp, device, precision, seed + run, net,
                           on_epoch=lambda figures: report({**figures, 'run': run}))
            log['runs'].append({key: value for key, value in result.items() if key != 'net'})
            report({**log['runs'][-1], 'run': run, 'epoch': 'eval'})
            status = 'finished' if run + 1 == args.runs else 'running'
            write_log(status)
            left = (time.perf_counter() - start) * (args.runs - 1)  # run 0's wall time, all of it
            if run == 0 and left >= 1:  # the default 25 runs take hours on a CPU
                amount = f'{left / 60:.1f} minutes' if left >= 90 else f'{left:.0f} seconds'
                print(f'about {amount} left for {args.runs - 1} more run{"s" * (args.runs > 2)}')
    except KeyboardInterrupt:
        status = 'interrupted'
        print(f"\nInterrupted: {len(log['runs'])} of {args.runs} runs finished and are in the log")
    except FloatingPointError as error:
        status = 'diverged'
        print(f'\nerror: {error} Earlier runs are in the log.')
    if len(log['runs']) > 1:  # a std needs two runs; intervals and tests are study.py's
        for key in ('tta_val_acc', 'total_time_seconds'):
            values = [run[key] for run in log['runs']]
            log[key] = dict(n=len(values), mean=statistics.mean(values),
                            std=statistics.stdev(values))
            print(f"{key}: mean {log[key]['mean']:.4f}  std {log[key]['std']:.4f}  n {len(values)}")
    write_log(status)
    print(f'Log: {log_dir}')  # as --log-dir gives it
    return {'finished': 0, 'diverged': 1, 'interrupted': 130}[status]

if __name__ == '__main__':
    sys.exit(main())
