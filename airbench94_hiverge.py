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
and renormalized only every few steps, and TTA for the least confident quarter of the test set.

Run: python airbench94_hiverge.py --runs 25 --data-dir data/cifar10 (see --help).
"""
import time
from math import ceil

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
    },
}

# ----------------------------------- Augmentation and the loader ----------------------------------
def batch_flip_lr(images, generator=None):
    """Mirror each image left-right with probability 1/2."""
    flip_mask = torch.rand(len(images), device=images.device, generator=generator) < 0.5
    return torch.where(flip_mask.view(-1, 1, 1, 1), images.flip(-1), images)

def batch_crop(padded_images, crop_size, generator=None):
    """Crop each image at its own uniformly random position: a random translation, once padded."""
    n, max_shift = len(padded_images), padded_images.size(-1) - crop_size
    shifts = torch.randint(max_shift + 1, (n, 2), device=padded_images.device, generator=generator)
    # windows[i, c, y, x] is the crop_size x crop_size window of image i whose corner is at (y, x)
    windows = padded_images.unfold(2, crop_size, 1).unfold(3, crop_size, 1)
    return windows[torch.arange(n, device=padded_images.device), :, shifts[:, 0], shifts[:, 1]]

def batch_brightness_contrast(images, brightness, contrast, generator=None):
    """Shift each image by a uniform draw in [-brightness, brightness], then scale it by one in
    [1 - contrast, 1 + contrast] (on normalized images: about the dataset's mean colour)."""
    draw = dict(device=images.device, dtype=images.dtype, generator=generator)
    shifts = (torch.rand(len(images), 1, 1, 1, **draw) * 2 - 1) * brightness
    scales = (torch.rand(len(images), 1, 1, 1, **draw) * 2 - 1) * contrast + 1
    return (images + shifts) * scales

class CifarLoader:
    """Random batches (the last partial one dropped) of images held on the device, augmented an
    epoch at a time; order and augmentation each from its own generator (None: torch's default).
    Alternating flip: epoch 0 mirrors a random half of the images; then each epoch the others;
    after the flip each image gets its own brightness and contrast jitter, anew every epoch."""

    def __init__(self, images, labels, batch_size, mean, std, aug, dtype=torch.float32,
                 order_generator=None, aug_generator=None, sampling='reshuffle'):
        self.images = images.permute(0, 3, 1, 2).to(dtype) / 255  # uint8 NHWC -> [0, 1] NCHW
        self.labels, self.batch_size, self.aug, self.sampling = labels, batch_size, aug, sampling
        self.order_generator, self.aug_generator, self.epoch = order_generator, aug_generator, 0
        self.mean = torch.tensor(mean, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.padded_images = None  # normalized, pre-flipped and reflect-padded in the first epoch

    def normalize(self, images):
        return (images - self.mean) / self.std

    def __len__(self):
        return len(self.images) // self.batch_size

    def augmented_epoch(self):
        flip, pad, aug = self.aug['flip'], self.aug['translate'], self.aug
        if self.padded_images is None:
            images = self.normalize(self.images)
            if flip == 'alternating':
                images = batch_flip_lr(images, self.aug_generator)
            self.padded_images = F.pad(images, (pad,) * 4, mode='reflect') if pad > 0 else images
        images = self.padded_images
        if pad > 0:
            images = batch_crop(images, self.images.size(-1), self.aug_generator)
        if flip == 'alternating' and self.epoch % 2 == 1:
            images = images.flip(-1)
        elif flip == 'random':
            images = batch_flip_lr(images, self.aug_generator)
        if aug['brightness'] > 0 or aug['contrast'] > 0:
            images = batch_brightness_contrast(images, aug['brightness'], aug['contrast'],
                                               self.aug_generator)
        return images

    def __iter__(self):
        images = self.augmented_epoch()
        self.epoch += 1
        n, draw = len(images), dict(device=images.device, generator=self.order_generator)
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
    """Whether the network and the Newton-Schulz iteration are compiled: on CUDA, as in the record;
    not on the CPU, where inductor's code was slower than eager (docs/cpu.md, "Speed")."""
    return device.type == 'cuda'

def recompile_on_requires_grad():
    """A new graph when a parameter's requires_grad changes (the whitening bias's freeze), as torch
    2.5, 2.6 and 2.12 on make by default; 2.4 and 2.7 to 2.11 would reuse the graph that computes
    the frozen bias's gradient (pytorch/pytorch#139476; docs/tests.md, "Torch versions")."""
    if torch.__version__ < '2.5':
        torch._dynamo.config.inline_inbuilt_nn_modules = True
    elif '2.7' <= torch.__version__ < '2.12':
        torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags = False

def build_net(arch, num_classes, device, precision):
    """make_net from hyp['net'], on the device in a precision recipe, channels_last. 'fp16': the
    CUDA recipe (fp16 weights and activations, BatchNorm in fp32); 'bf16': fp32 weights, bf16
    autocast (the CPU's); 'fp32'. Compiled where compiles(device): its forward, static shapes,
    CUDA graphs (max-autotune), every graph by the warmup run."""
    net = make_net(arch['widths'], num_classes, arch['batchnorm_momentum'], arch['scaling_factor'])
    net = net.to(device=device, memory_format=torch.channels_last)
    if precision == 'fp16':
        net = net.half()
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.float()
    if compiles(device):
        recompile_on_requires_grad()
        net.forward = torch.compile(net.forward, mode='max-autotune', dynamic=False)
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
            padded, size = F.pad(x, (1,) * 4, mode='reflect'), x.size(-1)
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
    a, b, c = 3.4576, -4.7391, 2.0843
    x = updates / (updates.norm(dim=(1, 2), keepdim=True) + 1e-7)  # singular values at most 1
    wide = x.size(1) <= x.size(2)
    x = x if wide else x.mT  # iterate with the smaller Gram matrix x x^T
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.mT

class Muon(torch.optim.Optimizer):
    """For conv filter banks (out_channels, in_channels, k, k). Each step: Nesterov momentum; each
    bank's flattened to out_channels x (in_channels k k), zero-padded to the largest shape, and all
    orthogonalized at once in dtype (compiled: one static graph); with renormalize, each bank first
    set to Frobenius norm sqrt(out_channels); then lr times its update off, and a decay by lr wd."""

    def __init__(self, params, lr, momentum, newton_schulz_steps, weight_decay, dtype,
                 compiled=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, steps=newton_schulz_steps,
                                      weight_decay=weight_decay, dtype=dtype))
        self.orthogonalize = (torch.compile(orthogonalize, dynamic=False) if compiled
                              else orthogonalize)
        for weight in self.param_groups[0]['params']:  # in the weights' dtype (fp16 on CUDA)
            self.state[weight]['momentum'] = torch.zeros_like(weight)

    @torch.no_grad()
    def step(self, renormalize=True):
        for group in self.param_groups:
            weights = [weight for weight in group['params'] if weight.grad is not None]
            if not weights:
                continue
            updates = []
            for weight in weights:
                buffer = self.state[weight]['momentum'].mul_(group['momentum']).add_(weight.grad)
                updates.append(weight.grad.add(buffer, alpha=group['momentum']).flatten(1))
            rows, cols = max(u.size(0) for u in updates), max(u.size(1) for u in updates)
            padded = torch.stack([F.pad(u, (0, cols - u.size(1), 0, rows - u.size(0)))
                                  for u in updates]).to(group['dtype'])
            orthogonal = self.orthogonalize(padded, group['steps'])
            for weight, update, matrix in zip(weights, updates, orthogonal):
                if renormalize:
                    weight.mul_(len(weight)**0.5 / (weight.norm() + 1e-7))
                matrix = matrix[:update.size(0), :update.size(1)].reshape_as(weight)
                weight.add_(matrix, alpha=-group['lr'])
                weight.mul_(1 - group['lr'] * group['weight_decay'])

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
    due, last = [], 0
    for step in range(1, total_steps + 1):  # counted from 1, as the published script counts
        interval = first_interval + int((last_interval - first_interval) * (step / total_steps))
        due.append(step - last >= interval)
        last = step if due[-1] else last
    return due

# -------------------------------------------- Training --------------------------------------------
def synchronized_time(device):
    """The clock (seconds) once the device has done its queued work (CUDA runs asynchronously)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    return time.perf_counter()

def source_seeds(seed):
    """Seeds of the three sources of randomness: initialization, data order, augmentation."""
    seeds = torch.randint(2**62, (3,), generator=torch.Generator().manual_seed(seed)).tolist()
    return dict(zip(('init', 'order', 'aug'), seeds))

def train(data, hyp, device, precision, seed, net=None, epoch_eval=True, on_epoch=None):
    """One run, determined by its seed: an int, or the seeds of source_seeds (each source of
    randomness has its own generator, so a study can vary one and hold the others). data: uint8
    images (N, 32, 32, 3) and labels of 'train' and 'test' on the device, 'classes', 'mean', 'std'.
    net: from build_net, reinitialized and trained in place (built when None). on_epoch(figures)
    gets each epoch's figures, untimed (it may raise to stop). Returns the run's figures and net."""
    opt, arch = hyp['opt'], hyp['net']
    batch_size, epochs = opt['batch_size'], opt['train_epochs']
    dtype = torch.float16 if precision == 'fp16' else torch.float32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=(precision == 'bf16'))
    newton_schulz_dtype = torch.bfloat16 if precision == 'bf16' else dtype  # fp16 as published
    seeds = seed if isinstance(seed, dict) else source_seeds(seed)
    generators = [torch.Generator(device).manual_seed(seeds[key]) for key in ('order', 'aug')]
    train_loader = CifarLoader(data['train']['images'], data['train']['labels'], batch_size,
                               data['mean'], data['std'], hyp['aug'], dtype, *generators)
    test_images, test_labels = data['test']['images'].permute(0, 3, 1, 2), data['test']['labels']
    test_images = train_loader.normalize(test_images.to(dtype) / 255)
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
    groups = [*sgd.param_groups, *muon.param_groups]  # groups[0]: the whitening bias
    initial_lrs = [group['lr'] for group in groups]
    lr_multipliers = lr_schedule(total_steps)
    renormalize = renormalization_steps(total_steps, *opt['renorm_every'])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=opt['label_smoothing'], reduction='sum')

    # Timed: the whitening init from the first training images (the first touch of the data)
    start_time = synchronized_time(device)
    whitening_images = train_loader.normalize(train_loader.images[:arch['whiten_images']])
    init_whitening(net[0], whitening_images, arch['whiten_eps'])
    total_time_seconds = synchronized_time(device) - start_time

    step, epoch_train_losses, val_acc = 0, [], None
    for epoch in range(ceil(epochs)):
        start_time = synchronized_time(device)
        net.train()
        for inputs, labels in train_loader:
            net[0].bias.requires_grad = step < whiten_bias_steps
            for group, initial_lr in zip(groups, initial_lrs):
                group['lr'] = initial_lr * lr_multipliers[step]
            groups[0]['lr'] = initial_lrs[0] * max(0.0, 1 - step / max(1, whiten_bias_steps))
            with autocast:
                outputs = net(inputs)
            loss = loss_fn(outputs.float(), labels)
            net.zero_grad(set_to_none=True)
            loss.backward()
            sgd.step()
            muon.step(renormalize[step])
            step += 1
            if step >= total_steps:
                break
        total_time_seconds += synchronized_time(device) - start_time

        # Not timed: the last batch's loss and accuracy, and the plain test accuracy
        epoch_train_losses.append(loss.item() / len(labels))
        train_acc = (outputs.detach().argmax(1) == labels).float().mean().item()
        if epoch_eval:
            logits = infer(net, test_images, 0, autocast)
            val_acc = (logits.argmax(1) == test_labels).float().mean().item()
        if on_epoch is not None:
            on_epoch(dict(epoch=epoch, train_loss=epoch_train_losses[-1], train_acc=train_acc,
                          val_acc=val_acc, total_time_seconds=total_time_seconds))

    # Timed: test-time augmentation, up to the existence of test predictions
    start_time = synchronized_time(device)
    logits = infer(net, test_images, arch['tta_level'], autocast,
                   tta_fraction=arch['tta_fraction'])
    total_time_seconds += synchronized_time(device) - start_time
    tta_val_acc = (logits.argmax(1) == test_labels).float().mean().item()
    return dict(seed=seed, seeds=seeds, steps=step, net=net, total_time_seconds=total_time_seconds,
                tta_val_acc=tta_val_acc, val_acc=val_acc, epoch_train_losses=epoch_train_losses)

####################################################################################################
# Running the script: identical in all the airbench scripts, not part of the method: the datasets  #
# (CIFAR-10/100, SVHN, image folders, the tensor cache), flags, logs, statistics and main().       #
####################################################################################################
import argparse, ast, copy, ctypes, json, math, os, pathlib, sys, uuid

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

class DataError(Exception):
    """A problem with the data or its location; the message says what is wrong and how to fix it."""

def read_image(path):
    from PIL import Image  # torchvision's dependency
    try:
        with Image.open(path) as image:
            image = image.convert('RGB')
    except Exception as error:
        raise DataError(f'{path} could not be read as an image ({error}). Remove or replace it.')
    if image.size != (32, 32):
        raise DataError(f'{path} is {image.size[0]}x{image.size[1]} pixels, but these scripts '
                        'train on 32x32 images and do not resize silently. Resize them first.')
    return torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(32, 32, 3)

def read_image_folder(data_dir, train_splits):
    """data_dir/<split>/<class>/<image>: the training splits (concatenated) and test/."""
    from torchvision.datasets import ImageFolder
    splits, first = {}, train_splits[0]
    for split in [*train_splits, 'test']:
        try:
            folder = ImageFolder(os.path.join(data_dir, split), loader=read_image)
        except FileNotFoundError as error:  # no class directories, or one without images
            raise DataError(f'{os.path.join(data_dir, split)}: {error} Expected the layout '
                            '<split>/<class>/<image>.') from None
        if splits and folder.classes != splits[first][2]:
            ours, theirs = set(folder.classes), set(splits[first][2])
            raise DataError(f'{data_dir}: {first}/ and {split}/ have different class directories '
                            f'(only in {first}: {sorted(theirs - ours)}; only in {split}: '
                            f'{sorted(ours - theirs)}). All splits need the same classes.')
        images = torch.stack([read_image(path) for path, _ in folder.samples])
        splits[split] = (images, torch.tensor(folder.targets), folder.classes)
    return {'train': {'images': torch.cat([splits[s][0] for s in train_splits]),
                      'labels': torch.cat([splits[s][1] for s in train_splits])},
            'test': {'images': splits['test'][0], 'labels': splits['test'][1]},
            'classes': splits['test'][2]}

def read_torchvision_dataset(name, data_dir, download):
    import torchvision
    data = {}
    for split in ('train', 'test'):
        if name == 'svhn':
            dataset = torchvision.datasets.SVHN(data_dir, split=split, download=download)
            images, labels = torch.from_numpy(dataset.data).permute(0, 2, 3, 1), dataset.labels
        else:
            dataset = getattr(torchvision.datasets, name.upper())(data_dir, split == 'train',
                                                                  download=download)
            images, labels = torch.from_numpy(dataset.data), dataset.targets
        data[split] = {'images': images.contiguous(), 'labels': torch.as_tensor(labels).long()}
    return {**data, 'classes': list(map(str, range(10))) if name == 'svhn' else dataset.classes}

def load_dataset(name, data_dir, train_splits=('train',), download=True, log=print):
    """{'train': {'images': uint8 (N, 32, 32, 3), 'labels'}, 'test', 'classes', 'mean', 'std'} from
    data_dir's tensor cache where it matches, else from its image-folder or torchvision layout
    (downloaded when absent), cached. mean, std: CIFAR-10's constants, else the training set's."""
    cache_path, splits = os.path.join(data_dir, 'airbench_cache.pt'), [*train_splits, 'test']
    folder = all(os.path.isdir(os.path.join(data_dir, split)) for split in splits)
    files = [os.stat(os.path.join(root, file)) for split in splits if folder
             for root, _, names in os.walk(os.path.join(data_dir, split)) for file in names]
    # A cache is rebuilt when an image folder's file count, size or latest change differ
    source = dict(version=2, dataset=name, train_splits=list(train_splits), fingerprint=[
        len(files), sum(f.st_size for f in files), max((f.st_mtime_ns for f in files), default=0)]
                  if folder else None)
    if os.path.exists(cache_path):
        try:
            data = torch.load(cache_path, map_location='cpu', weights_only=True)
            stale = [key for key, value in source.items() if data.get(key) != value]
            if not stale:
                return data
            log(f'The tensor cache {cache_path} does not match this data ({", ".join(stale)} '
                'differ); rebuilding it.')
        except Exception as error:
            log(f'The tensor cache {cache_path} is unreadable ({error}); rebuilding it.')
    if folder:
        log(f'Decoding the image-folder dataset in {data_dir} (done once, then cached) ...')
        data = read_image_folder(data_dir, train_splits)
    elif name == 'folder':
        raise DataError(f'{os.path.abspath(data_dir)} is not in the image-folder layout: it needs '
                        f'the subdirectories {", ".join(s + "/" for s in splits)} each holding one '
                        'directory of 32x32 images per class. Point --data-dir at one.')
    else:
        try:
            data = read_torchvision_dataset(name, data_dir, download)
        except Exception as error:
            raise DataError(
                f'No {name} dataset found in {os.path.abspath(data_dir)} and it could not be '
                f'downloaded ({type(error).__name__}: {error}). Run once with network access (it '
                f"is downloaded there), or put torchvision's files for {name} there, or point "
                '--data-dir at an image-folder layout: train/<class>/*, test/<class>/* images.'
            ) from None
    pixels = data['train']['images'].reshape(-1, 3).double() / 255
    data['mean'], data['std'] = ((CIFAR10_MEAN, CIFAR10_STD) if name == 'cifar10' else
                                 (tuple(pixels.mean(0).tolist()), tuple(pixels.std(0).tolist())))
    data.update(source)
    try:
        os.makedirs(data_dir, exist_ok=True)
        atomic_write(cache_path, lambda path: torch.save(data, path))
    except (OSError, RuntimeError) as error:  # torch.save's failed write is a RuntimeError
        log(f'Could not write the tensor cache {cache_path} ({error}); continuing without it.')
    return data

def dummy_dataset(num_classes, batch_size, num_test, device):
    """Random data for the warmup: two training batches, test batches of the real set's sizes."""
    def split(n):
        return {'images': torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, device=device),
                'labels': torch.randint(0, num_classes, (n,), device=device)}
    full_batch = EVAL_BATCH_SIZE if num_test >= EVAL_BATCH_SIZE else 0
    return {'train': split(2 * batch_size), 'test': split(full_batch + num_test % EVAL_BATCH_SIZE),
            'classes': list(range(num_classes)), 'mean': CIFAR10_MEAN, 'std': CIFAR10_STD}

def describe(values):
    """n, mean, sample standard deviation and 95% confidence interval of the mean."""
    n = len(values)
    if n < 2:
        return dict(n=n, mean=values[0] if n else None, std=None, ci95=None)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean)**2 for v in values) / (n - 1))
    z, dof = 1.959964, n - 1  # Student's t, two-sided 95%: a table to 30 dof, then Cornish-Fisher
    t = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042][dof - 1] if dof <= 30 else (
        z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2))
    return dict(n=n, mean=mean, std=std, ci95=[mean - t * std / n**0.5, mean + t * std / n**0.5])

COLUMNS = {'run': 6, 'epoch': 5, 'train_loss': 10, 'train_acc': 9, 'val_acc': 7,
           'tta_val_acc': 11, 'total_time_seconds': 18}

def format_row(values=None):
    """One row of the per-epoch table; with no values, the header."""
    cells = [c if values is None else values.get(c) for c in COLUMNS]
    cells = ['' if v is None else f'{v:.4f}' if isinstance(v, float) else str(v) for v in cells]
    return '|  ' + '  |  '.join(map(str.rjust, cells, COLUMNS.values())) + '  |'

def atomic_write(path, write):
    """write(a temporary path), then rename it to path: a crash never leaves a half-written file."""
    temporary = f'{path}.tmp{os.getpid()}'
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)

def write_logs(log_dir, code, results, config, status):
    """log.pt (the source, runs, configuration) and summary.json: rewritten after every run."""
    os.makedirs(log_dir, exist_ok=True)  # made here first: a study refused at its start leaves none
    accs, times = [r['tta_val_acc'] for r in results], [r['total_time_seconds'] for r in results]
    log = dict(code=code, accs=torch.tensor(accs), times=torch.tensor(times), runs=results,
               status=status, **config)
    atomic_write(os.path.join(log_dir, 'log.pt'), lambda path: torch.save(log, path))
    summary = dict(status=status, runs_finished=len(results), runs_requested=config['args']['runs'],
                   tta_val_acc=describe(accs), total_time_seconds=describe(times), **config,
                   runs=results)
    atomic_write(os.path.join(log_dir, 'summary.json'),
                 lambda path: pathlib.Path(path).write_text(json.dumps(summary, indent=2)))

def study_hyp(args):
    """hyp with --epochs and each --hyp GROUP.KEY=VALUE set (a word such as 'random': a string),
    every value checked (check_hyp)."""
    run_hyp = copy.deepcopy(hyp)
    run_hyp['aug']['flip'] = 'none' if args.dataset == 'svhn' else run_hyp['aug']['flip']  # paper
    for text in args.hyp:
        key, sep, value = text.partition('=')
        *groups, name = key.split('.')
        node = run_hyp
        for group in groups:
            node = node.get(group) if isinstance(node.get(group), dict) else {}
        if not sep or not groups or name not in node:
            raise ValueError(f'--hyp takes KEY=VALUE (for example opt.lr=10), not {text!r}'
                             if not sep else f'--hyp {key}: no such hyperparameter (see hyp)')
        try:
            node[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            node[name] = value
    run_hyp['opt']['train_epochs'] = args.epochs or run_hyp['opt']['train_epochs']
    check_hyp(run_hyp, hyp)
    return run_hyp

def is_whole(value):
    return isinstance(value, int) and not isinstance(value, bool)

HYP_CHOICES = {'flip': ('alternating', 'random', 'none'), 'tta_level': (0, 1, 2),
               'sampling': ('reshuffle', 'replacement'), 'whiten': (True, False),
               'identity_init': (True, False), 'convs_per_block': (2, 3)}
HYP_RULES = {  # by a key's name, or its dict's (widths), in every script's hyp that has it
    'batch_size': ('a whole number of images, at least 1', lambda v: is_whole(v) and v >= 1),
    'widths': ('a whole number of channels, at least 1', lambda v: is_whole(v) and v >= 1),
    'train_epochs': ('a number of epochs above 0', lambda v: v > 0),
    'lookahead_every': ('a whole number of steps, 0: no Lookahead', is_whole),
    'translate': ('a whole number of pixels below 32', lambda v: is_whole(v) and v < 32),
    'cutout': ('a whole number of pixels up to 32', lambda v: is_whole(v) and v <= 32),
    **{name: ('a whole number, at least 1', lambda v: is_whole(v) and v >= 1)
       for name in ('renorm_every', 'step_every', 'whiten_images', 'newton_schulz_steps')},
    **{name: ('a number from 0 to 1', lambda v: v <= 1) for name in (
        'label_smoothing', 'batchnorm_momentum', 'tta_fraction', 'masked_fraction',
        'lr_peak_fraction')},
    **{name: ('a number from 0 to below 1', lambda v: v < 1)
       for name in ('momentum', 'filter_momentum')}}

def check_hyp(value, default, path=()):
    """Refuse a value of another kind than hyp's (a dict with its keys, a number for a number, a
    pair for a pair) or outside what the method takes (HYP_CHOICES, HYP_RULES; numbers are
    finite, of the sign of hyp's: a rate, a size or a count is never negative), before any
    training."""
    key = '.'.join(path)
    if isinstance(default, dict) and not (isinstance(value, dict) and
                                          value.keys() == default.keys()):
        raise ValueError(f"--hyp {key} takes a dict with the keys {', '.join(default)}")
    if isinstance(default, dict):
        return [check_hyp(value[name], default[name], (*path, name)) for name in default]
    if path[-1] in HYP_CHOICES and value not in HYP_CHOICES[path[-1]]:
        *others, last = map(repr, HYP_CHOICES[path[-1]])
        raise ValueError(f"--hyp {key} takes {', '.join(others)} or {last}")
    if isinstance(default, (tuple, list)) and not (isinstance(value, (tuple, list)) and
                                                   len(value) == len(default)):
        raise ValueError(f'--hyp {key} takes {len(default)} values, as in {default}')
    if isinstance(default, (tuple, list)):
        return [check_hyp(v, d, path) for v, d in zip(value, default)]
    sign = -1 if isinstance(default, (int, float)) and default < 0 else 1
    what, test = next((HYP_RULES[name] for name in reversed(path) if name in HYP_RULES),
                      (f'a number, at {"least" if sign > 0 else "most"} 0', lambda v: True))
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (int, float)) and not isinstance(default, bool) and not (
            number and math.isfinite(value) and sign * value >= 0 and test(value)):
        raise ValueError(f'--hyp {key} takes {what}, not {value!r}')

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add('--runs', type=int, default=25, help='timed training runs')
    add('--dataset', default='cifar10', choices=['cifar10', 'cifar100', 'svhn', 'folder'],
        help='folder: any image-folder dataset; the others also from their torchvision layout')
    add('--data-dir', default='data/DATASET', help='an image folder (train/<class>/*, '
        "test/<class>/*) or torchvision's layout (downloaded when absent); cached as tensors")
    add('--train-splits', default='train', help='image-folder splits to train on, e.g. train,valid')
    add('--device', default='auto', help='auto (CUDA if present), cpu, cuda, cuda:1, ...')
    add('--precision', default='auto', choices=['auto', 'fp16', 'bf16', 'fp32'], help='auto: fp16 '
        'on CUDA; on the CPU bf16 autocast where the CPU has native bf16, else fp32')
    add('--seed', type=int, help='seed of the first run; run i uses seed+i (None: random, logged)')
    add('--log-dir', default='logs', help='logs go to LOG_DIR/<uuid>/')
    add('--epochs', type=float, help="the schedule fitted to this many epochs (None: hyp's)")
    add('--hyp', action='append', default=[], metavar='KEY=VALUE', help='set a hyperparameter '
        '(repeatable): --hyp opt.lr=10 --hyp aug.flip=random --hyp net.tta_level=0')
    add('--epoch-eval', action=argparse.BooleanOptionalAction, default=True, help='untimed')
    add('--warmup', action=argparse.BooleanOptionalAction, default=True, help='untimed, dummy data')
    add('--deterministic', action='store_true', help='CUDA: a seed repeats a run bitwise (slower)')
    args = parser.parse_args(argv)
    if args.dataset == 'folder' and args.data_dir == 'data/DATASET':
        parser.error('--dataset folder needs --data-dir DIR (a directory with train/ and test/)')
    args.data_dir = args.data_dir.replace('DATASET', args.dataset)
    if args.runs < 1:
        parser.error(f'--runs must be at least 1, not {args.runs}')
    if args.epochs is not None and not (args.epochs > 0 and math.isfinite(args.epochs)):
        parser.error(f'--epochs must be a positive number, not {args.epochs}')
    return args

def resolve_device_precision(device_name, precision):
    try:
        device = torch.device(device_name.replace('auto', 'cuda' if torch.cuda.is_available()
                                                  else 'cpu'))
    except RuntimeError:
        raise ValueError(f'--device {device_name!r} is not a device; use auto, cpu, cuda or cuda:N')
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'--device {device_name} asks for CUDA, but this torch '
                         f'({torch.__version__}) sees no CUDA device; use --device cpu or auto.')
    if precision == 'auto':  # without native bf16, bf16 convolutions are several times slower
        native_bf16 = device.type == 'cpu' and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        precision = 'fp16' if device.type == 'cuda' else 'bf16' if native_bf16 else 'fp32'
    return device, precision

def keep_freed_memory_in_process():
    """Make glibc's malloc keep freed memory: by default each CPU training step would page-fault
    and zero-fill its large activations anew (docs/cpu.md, "Speed"). False without glibc."""
    try:
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version  # both exist only in glibc
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))

def compiled_graph_count():
    """Graphs torch.compile has compiled in this process (0 where nothing is compiled)."""
    dynamo_utils = sys.modules.get('torch._dynamo.utils')
    return dynamo_utils.counters['stats']['unique_graphs'] if dynamo_utils else 0

def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    code = pathlib.Path(os.path.abspath(__file__)).read_text()
    try:
        args = parse_args(argv)
        device, precision = resolve_device_precision(args.device, args.precision)
        run_hyp = study_hyp(args)
        data = load_dataset(args.dataset, args.data_dir, args.train_splits.split(','))
        num_train, num_test = len(data['train']['labels']), len(data['test']['labels'])
        num_classes = len(data['classes'])
        if num_train < run_hyp['opt']['batch_size']:
            raise DataError(f"{num_train} training images make no full batch of "
                            f"{run_hyp['opt']['batch_size']}; set --hyp opt.batch_size=N lower.")
    except (ValueError, DataError) as error:
        sys.exit(f'error: {error}')
    keep_freed_memory_in_process()  # for the CPU's training steps; harmless beside a GPU
    torch.backends.cudnn.benchmark = not args.deterministic
    if args.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    base_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), 'little') >> 1
    log_dir, results = os.path.join(args.log_dir, str(uuid.uuid4())), []
    data.update({split: {k: v.to(device) for k, v in data[split].items()}
                 for split in ('train', 'test')})
    config = dict(hyp=run_hyp, args=vars(args), argv=argv, device=str(device), precision=precision,
                  torch_version=torch.__version__, script=os.path.basename(__file__),
                  base_seed=base_seed, num_train=num_train, num_test=num_test)
    print(f'device {device}, precision {precision}, torch {torch.__version__}, {num_train} train / '
          f'{num_test} test images, {num_classes} classes, seed {base_seed}, log {log_dir}')
    write_logs(log_dir, code, results, config, 'running')

    def report(run, figures):
        if not math.isfinite(figures['train_loss']):
            raise FloatingPointError(f"run {run}: the training loss became {figures['train_loss']} "
                                     f"in epoch {figures['epoch']}. Lower the learning rate (--hyp "
                                     'opt.lr=...) or check the data; earlier runs are in the log.')
        print(format_row({**figures, 'run': run if figures['epoch'] == 0 else None}))

    try:
        net = build_net(run_hyp['net'], num_classes, device, precision)
        start_time, graphs_before = time.perf_counter(), compiled_graph_count()
        if args.warmup:  # untimed: first-call costs (allocation, kernel selection, compilation)
            dummy = dummy_dataset(num_classes, run_hyp['opt']['batch_size'], num_test, device)
            train(dummy, run_hyp, device, precision, base_seed, net, args.epoch_eval)
        config['warmup_seconds'] = time.perf_counter() - start_time
        config['graphs_compiled_in_warmup'] = compiled_graph_count() - graphs_before
        graphs_before = compiled_graph_count()
        print(f"warmup: {config['warmup_seconds']:.1f} s, {config['graphs_compiled_in_warmup']} "
              f'graphs compiled\n{format_row()}')
        for run in range(args.runs):
            result = train(data, run_hyp, device, precision, base_seed + run, net, args.epoch_eval,
                           on_epoch=lambda figures: report(run, figures))
            result['graphs_compiled_since_warmup'] = compiled_graph_count() - graphs_before
            results.append({key: value for key, value in result.items() if key != 'net'})
            print(format_row({**result, 'epoch': 'eval'}))
            status = 'finished' if len(results) == args.runs else 'running'
            write_logs(log_dir, code, results, config, status)
    except KeyboardInterrupt:
        status = 'interrupted'
        print(f'\nInterrupted: {len(results)} of {args.runs} runs finished and are in the log')
    except FloatingPointError as error:  # from report()
        status = 'diverged'
        print(f'\nerror: {error}')
    write_logs(log_dir, code, results, config, status)
    for name, key, d in (('TTA accuracy', 'tta_val_acc', 4),
                         ('Timed seconds', 'total_time_seconds', 3)):
        stats = describe([r[key] for r in results])
        if stats['n'] > 1:
            print(f"{name}: mean {stats['mean']:.{d}f}  std {stats['std']:.{d}f}  n {stats['n']}  "
                  f"95% CI [{stats['ci95'][0]:.{d}f}, {stats['ci95'][1]:.{d}f}]")
        elif stats['n'] == 1:
            print(f"{name}: {stats['mean']:.{d}f} (n 1)")
    print(f'Log: {os.path.abspath(log_dir)}')
    return {'finished': 0, 'diverged': 1, 'interrupted': 130}[status]

if __name__ == '__main__':
    sys.exit(main())
