"""airbench96_faster.py: CIFAR-10 to 96% in 3.1 PFLOPs: train on the hardest half of every batch.

Method: K. Jordan's later 96% record (github.com/KellerJordan/cifar10-airbench,
airbench96_faster.py). A small proxy network (146,744 parameters: widths 32/64/64, airbench94's two
convolutions per block) first makes one pass over the stream of augmented batches that the main
network will see, the same batches in the same order: in each batch of 1024 it finds the 512
examples of highest loss, and on every fourth batch it takes an SGD step on their loss. The main
network (9,918,776 parameters: widths 128/384/512, airbench96's block) then trains on each batch's
hardest 512 only, for 45 epochs. Training costs 3.1 PFLOPs (the record's figure; airbench96: 7.2):
tools/flops.py counts 3.16 as run (3.17 at 3 x forward), of which the proxy's pass 0.11.

Evidence: NVIDIA A100 (the record, torch 2.4.0): 96.00% mean TTA accuracy, n=200, 27.3 s per run.
CPUs, CIFAR-10 re-encoded as JPEG: docs/cpu.md's results (n, host, command). Timed as in the
paper: from the first touch of training data (whitening init) through the proxy's pass and the
training to the test predictions (after TTA).

Changes relative to airbench96.py (line by line: docs/layout.md): the proxy's pass
(hardest_examples, select_hardest, hyp['proxy']), an endless loader whose batches run across
epochs, blocks of two or three convolutions, and the record's hyp (45 epochs, weight decay 0.012,
widths 128/384/512, the lr's peak at 10% of the steps and its end at 0). Where the record departs
from airbench96, ours follows the record, and from the record's weights and batches trains as it
does (docs/cpu.md: its equivalence check, of commit 941a02a).

Run: python airbench96_faster.py --runs 5 --data-dir data/cifar10 (see --help). Importing it only
defines things: the method, then below the banner "Running the script" what runs it (alike in all
scripts).
"""
import time
from itertools import islice
from math import ceil, inf

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------- Hyperparameters -----------------------------------------
hyp = {
    'opt': {
        'train_epochs': 45,         # epochs of len(loader) batches; the stream runs across epochs
        'batch_size': 1024,         # examples per batch of the stream, which the proxy sees whole
        'masked_fraction': 0.5,     # of each batch, the hardest examples the main network trains on
        'sampling': 'reshuffle',    # each epoch a permutation; 'replacement': N uniform draws
        'lr': 9.0,                  # learning rate per 1024 examples of the stream
        'momentum': 0.85,           # Nesterov momentum (lr and decay are decoupled from it)
        'weight_decay': 0.012,      # weight decay per 1024 examples of the stream, apart from lr
        'bias_scaler': 64.0,        # BatchNorm biases get this times the lr (same decay strength)
        'label_smoothing': 0.2,     # of the cross-entropy, which is summed over the batch
        'whiten_bias_epochs': 45,   # epochs for which the whitening layer's bias is trained
        'lookahead_every': 5,       # steps between Lookahead updates; 0 or above the run's: none
        'lr_peak_fraction': 0.1,    # of the steps, where the lr peaks: linear from 0.2x up to 1x,
        'lr_end': 0.0,              # then falls linearly to this multiple at the last step
    },
    'aug': {
        'flip': 'alternating',      # 'alternating' (the paper's), 'random' (coin per epoch), 'none'
        'translate': 4,             # pixels of reflect padding before a random 32x32 crop
        'cutout': 12,               # side in pixels of the zeroed square; 0 disables cutout
    },
    'net': {
        'widths': {'block1': 128, 'block2': 384, 'block3': 512},   # output channels per block
        'convs_per_block': 3,       # 3: a residual around the last two convs (ConvGroup)
        'batchnorm_momentum': 0.9,  # running = 0.9 * running + 0.1 * batch statistic
        'scaling_factor': 1 / 9,    # the logits are multiplied by this
        'whiten': True,             # False: a plain first conv (default init), trained every epoch
        'whiten_eps': 5e-4,         # added to the patch eigenvalues before the inverse square root
        'identity_init': True,      # False: the 3x3 convs keep PyTorch's default init
        'tta_level': 2,             # 0: plain, 1: mirror, 2: mirror and two one-pixel translations
    },
    'proxy': {                      # the selecting network; net's whiten and identity_init apply
        'widths': {'block1': 32, 'block2': 64, 'block3': 64},      # output channels per block
        'convs_per_block': 2,       # airbench94's block
        'batchnorm_momentum': 0.9,  # (it always normalizes with each batch's own statistics)
        'scaling_factor': 1 / 9,    # the logits are multiplied by this
        'step_every': 4,            # batches per SGD step of the proxy; forward only on the others
    },
}

# The values hyp takes: each switch's choices, each number's inclusive range (widths and a
# tuple: each element's); a number in neither keeps the sign of hyp's. study.py refuses any other
# value before training (python study.py SCRIPT ... -- --hyp KEY=VALUE).
HYP_CHOICES = {
    'opt.sampling': ('reshuffle', 'replacement'),
    'aug.flip': ('alternating', 'random', 'none'),
    'net.convs_per_block': (2, 3),
    'net.whiten': (True, False),
    'net.identity_init': (True, False),
    'net.tta_level': (0, 1, 2),
    'proxy.convs_per_block': (2, 3),
}
HYP_RANGES = {
    'opt.train_epochs': (0.001, inf),
    'opt.batch_size': (1, inf),
    'opt.masked_fraction': (0, 1),
    'opt.momentum': (0, 0.999),
    'opt.label_smoothing': (0, 1),
    'opt.lr_peak_fraction': (0, 1),
    'aug.translate': (0, 31),
    'aug.cutout': (0, 32),
    'net.widths': (1, inf),
    'net.batchnorm_momentum': (0, 1),
    'proxy.widths': (1, inf),
    'proxy.batchnorm_momentum': (0, 1),
    'proxy.step_every': (1, inf),
}

# ----------------------------------- Augmentation and the loader ----------------------------------
def batch_flip_lr(images, generator=None):
    """Mirror each image left-right with probability 1/2."""
    flip_mask = torch.rand(len(images), device=images.device, generator=generator) < 0.5
    return torch.where(flip_mask.view(-1, 1, 1, 1), images.flip(-1), images)

def batch_crop(padded_images, crop_size, generator=None):
    """Crop each image at its own uniformly random position: a random translation, once padded."""
    n = len(padded_images)
    max_shift = padded_images.size(-1) - crop_size
    shifts = torch.randint(max_shift + 1, (n, 2), device=padded_images.device, generator=generator)
    # windows[i, c, y, x] is the crop_size x crop_size window of image i whose corner is at (y, x)
    windows = padded_images.unfold(2, crop_size, 1).unfold(3, crop_size, 1)
    return windows[torch.arange(n, device=padded_images.device), :, shifts[:, 0], shifts[:, 1]]

def batch_cutout(images, size, generator=None):
    """Zero one size x size square per image, at a uniformly random position inside the image."""
    n, _, height, width = images.shape
    top = torch.randint(height - size + 1, (n, 1, 1), device=images.device, generator=generator)
    left = torch.randint(width - size + 1, (n, 1, 1), device=images.device, generator=generator)
    rows = torch.arange(height, device=images.device).view(1, -1, 1)
    cols = torch.arange(width, device=images.device).view(1, 1, -1)
    inside = (rows >= top) & (rows < top + size) & (cols >= left) & (cols < left + size)
    return images.masked_fill(inside.unsqueeze(1), 0)

class CifarLoader:
    """An endless stream of random batches of images held on the device, augmented an epoch at a
    time; a batch that an epoch's end cuts short is completed from the next epoch, so no image is
    dropped. Order and augmentation each from its own generator (None: torch's default). Every pass
    over the loader restarts the stream from the generators' states at construction, so the passes
    see the same batches in the same order (where generators are given). Alternating flip: epoch 0
    mirrors a random half of the images; then each epoch the others."""

    def __init__(self, images, labels, batch_size, mean, std, aug, dtype=torch.float32,
                 order_generator=None, aug_generator=None, sampling='reshuffle'):
        self.images = images.permute(0, 3, 1, 2).to(dtype) / 255  # uint8 NHWC -> [0, 1] NCHW
        self.labels = labels
        self.batch_size = batch_size
        self.aug = aug
        self.sampling = sampling
        self.order_generator = order_generator
        self.aug_generator = aug_generator
        self.epoch = 0
        self.initial_states = [None if generator is None else generator.get_state()
                               for generator in (order_generator, aug_generator)]
        self.mean = torch.tensor(mean, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=images.device, dtype=dtype).view(1, -1, 1, 1)
        self.padded_images = None  # normalized, pre-flipped and reflect-padded in the first epoch

    def normalize(self, images):
        return (images - self.mean) / self.std

    def __len__(self):
        """Batches per epoch, the unit of the schedule (a cut-short batch not counted)."""
        return len(self.images) // self.batch_size

    def augmented_epoch(self):
        flip = self.aug['flip']
        pad = self.aug['translate']
        cutout = self.aug['cutout']
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
        if cutout > 0:
            images = batch_cutout(images, cutout, self.aug_generator)
        return images

    def __iter__(self):
        for generator, state in zip((self.order_generator, self.aug_generator),
                                    self.initial_states):
            if generator is not None:
                generator.set_state(state)
        self.epoch = 0
        self.padded_images = None
        leftover = None
        while True:
            images = self.augmented_epoch()
            self.epoch += 1
            n = len(images)
            draw = dict(device=images.device, generator=self.order_generator)
            indices = (torch.randint(n, (n,), **draw) if self.sampling == 'replacement'  # N draws
                       else torch.randperm(n, **draw))
            start = 0
            if leftover is not None:  # images and labels of the batch that the last epoch began
                start = self.batch_size - len(leftover[1])
                yield (torch.cat([leftover[0], images[indices[:start]]]),
                       torch.cat([leftover[1], self.labels[indices[:start]]]))
            while start + self.batch_size <= len(images):
                batch = indices[start:start + self.batch_size]
                yield images[batch], self.labels[batch]
                start += self.batch_size
            rest = indices[start:]
            leftover = (images[rest], self.labels[rest]) if len(rest) > 0 else None

# --------------------------------- Network and its initialization ---------------------------------
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
    """conv -> pool -> BN -> GELU, then [conv -> BN -> GELU]: airbench94's block. With three
    convolutions, the record's: conv -> BN -> GELU -> conv -> BN, plus the pair's input, then GELU
    (airbench96 adds the input after that GELU)."""

    def __init__(self, channels_in, channels_out, batchnorm_momentum, convs=3):
        super().__init__()
        self.conv1 = conv3x3(channels_in, channels_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = BatchNorm(channels_out, batchnorm_momentum)
        self.conv2 = conv3x3(channels_out, channels_out)
        self.norm2 = BatchNorm(channels_out, batchnorm_momentum)
        self.residual = convs == 3
        if self.residual:
            self.conv3 = conv3x3(channels_out, channels_out)
            self.norm3 = BatchNorm(channels_out, batchnorm_momentum)
        self.activ = nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        if not self.residual:
            return self.activ(self.norm2(self.conv2(x)))
        return self.activ(x + self.norm3(self.conv3(self.activ(self.norm2(self.conv2(x))))))

def init_identity(net):
    """The first M filters of each 3x3 conv with M inputs become the identity; the rest stay."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (3, 3):
            nn.init.dirac_(module.weight[:module.weight.size(1)])  # in place, without autograd

def make_net(widths, num_classes, batchnorm_momentum, scaling_factor, convs_per_block=3,
             whiten_kernel_size=2):
    """2x2 whitening conv (31x31 maps) -> three blocks (15, 7, 3) -> 3x3 max-pool -> linear -> x
    scale, identity-initialized; the whitening weights are set from the data, never trained."""
    whiten_width = 2 * 3 * whiten_kernel_size**2
    net = nn.Sequential(
        nn.Conv2d(3, whiten_width, whiten_kernel_size, padding=0, bias=True),
        nn.GELU(),
        ConvGroup(whiten_width, widths['block1'], batchnorm_momentum, convs_per_block),
        ConvGroup(widths['block1'], widths['block2'], batchnorm_momentum, convs_per_block),
        ConvGroup(widths['block2'], widths['block3'], batchnorm_momentum, convs_per_block),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(widths['block3'], num_classes, bias=False),
        Mul(scaling_factor),
    )
    reinitialize(net)
    return net

def reinitialize(net, whiten=True, identity_init=True):
    """make_net's network anew (default init, identity init if identity_init, the first conv's bias
    trainable, its weights too unless whiten): one built, or compiled, network serves many runs."""
    for module in net.modules():
        if hasattr(module, 'reset_parameters'):  # PyTorch's default init of each layer
            module.reset_parameters()
    if identity_init:
        init_identity(net)
    net[0].weight.requires_grad = not whiten
    net[0].bias.requires_grad = True

def build_net(arch, num_classes, device, precision):
    """make_net from hyp['net'] (or hyp['proxy']), on the device in a precision recipe,
    channels_last. 'fp16': the paper's CUDA recipe (fp16 weights and activations, BatchNorm in
    fp32); 'bf16': fp32 weights, the forward pass under bf16 autocast (the CPU recipe, see train);
    'fp32': plain fp32."""
    net = make_net(arch['widths'], num_classes, arch['batchnorm_momentum'], arch['scaling_factor'],
                   arch['convs_per_block'])
    net = net.to(device=device, memory_format=torch.channels_last)
    if precision == 'fp16':
        net = net.half()
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.float()
    return net

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
    drop) and zero its bias, which is trained for the first epochs."""
    filters = whitening_filters(images, layer.kernel_size[0], eps)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([filters, -filters]))
        layer.bias.zero_()

# --------------------------------------- Evaluation and TTA ---------------------------------------
EVAL_BATCH_SIZE = 2000  # test images per forward pass

def infer(net, images, tta_level, autocast, batch_size=EVAL_BATCH_SIZE):
    """Logits (fp32) for normalized images. TTA level 0: the image; 1: the mean of the image and
    its mirror; 2: the image and its mirror weigh 1/4 each, and the image translated one pixel
    diagonally each way (reflect padding) and those two mirrored weigh 1/8 each."""
    def mirror_mean(x):
        return 0.5 * net(x).float() + 0.5 * net(x.flip(-1)).float()

    def predict(x):
        if tta_level == 0:
            return net(x).float()
        if tta_level == 1:
            return mirror_mean(x)
        padded = F.pad(x, (1,) * 4, mode='reflect')
        size = x.size(-1)
        shifted = [padded[:, :, :size, :size], padded[:, :, 2:, 2:]]
        return 0.5 * mirror_mean(x) + 0.25 * sum(mirror_mean(view) for view in shifted)

    net.eval()
    with torch.no_grad(), autocast:
        return torch.cat([predict(batch) for batch in images.split(batch_size)])

# ---------------------------- Optimizer groups, schedule and Lookahead ----------------------------
def decoupled_sgd_groups(net, lr, weight_decay, momentum, batch_size, bias_scaler):
    """Parameter groups for torch.optim.SGD from the decoupled lr and weight decay (each per 1024
    examples). With constant gradients, Nesterov momentum makes the steps 1 + 1/(1 - momentum)
    times the gradient: dividing by that makes the step size independent of momentum. The decay
    per step (PyTorch's lr * weight_decay) is the same in every group, whatever its lr."""
    kilostep_scale = 1024 * (1 + 1 / (1 - momentum))
    base_lr = lr / kilostep_scale
    bias_lr = bias_scaler * lr / kilostep_scale
    decay_per_step = weight_decay * batch_size / kilostep_scale
    trainable = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
    norm_biases = [p for name, p in trainable if 'norm' in name]
    others = [p for name, p in trainable if 'norm' not in name]
    return [dict(params=norm_biases, lr=bias_lr, weight_decay=decay_per_step / bias_lr),
            dict(params=others, lr=base_lr, weight_decay=decay_per_step / base_lr)]

def lr_schedule(total_steps, start=0.2, peak_fraction=0.23, end=0.07):
    """The lr's multiplier at steps 0..total_steps: linear from start up to 1, then down to end."""
    peak = int(peak_fraction * total_steps)
    steps = torch.arange(total_steps + 1, dtype=torch.float64)
    warmup = start + (1 - start) * steps / max(peak, 1)
    decay = 1 + (end - 1) * (steps - peak) / max(total_steps - peak, 1)
    return torch.where(steps < peak, warmup, decay)

class LookaheadState:
    """A slow copy of the model state's floats (parameters, BatchNorm statistics). update() moves it
    toward the live model by (1 - decay), then sets the live model to it."""

    def __init__(self, net):
        self.slow = {key: t.clone() for key, t in net.state_dict().items() if t.is_floating_point()}

    def update(self, net, decay):
        with torch.no_grad():
            for name, live in net.state_dict().items():
                if name in self.slow:
                    self.slow[name].lerp_(live, 1 - decay)
                    live.copy_(self.slow[name])

def lookahead_decay(step, total_steps):
    """The slow copy's decay: 0.95**5 at the end of training, ramping up as step**3."""
    return 0.95**5 * (step / total_steps)**3

# ------------------------------------- The proxy's selection --------------------------------------
def hardest_examples(losses, count):
    """Indices of the count highest losses, in ascending order (their order in the batch). Found on
    the device: topk, not a sort and a boolean mask, whose size the host would have to read."""
    return losses.topk(count, sorted=False).indices.sort().values

def select_hardest(proxy, optimizer, loader, total_steps, lr_multipliers, masked_count, step_every,
                   label_smoothing, autocast):
    """The proxy's pass over the first total_steps batches of the loader: for each batch, the
    indices of its masked_count examples of highest loss (label-smoothed cross-entropy); on every
    step_every-th batch also an SGD step on their summed loss, at the lr of the schedule's step.
    In training mode throughout: BatchNorm normalizes with each batch's own statistics."""
    initial_lrs = [group['lr'] for group in optimizer.param_groups]
    selections = []
    proxy.train()
    for step, (inputs, labels) in zip(range(total_steps), loader):
        takes_step = step % step_every == 0
        with torch.set_grad_enabled(takes_step), autocast:
            outputs = proxy(inputs)
        losses = F.cross_entropy(outputs.float(), labels, label_smoothing=label_smoothing,
                                 reduction='none')
        selections.append(hardest_examples(losses.detach(), masked_count))
        if takes_step:
            for group, initial_lr in zip(optimizer.param_groups, initial_lrs):
                group['lr'] = initial_lr * lr_multipliers[step]
            optimizer.zero_grad(set_to_none=True)
            losses.gather(0, selections[-1]).sum().backward()
            optimizer.step()
    return selections

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
    randomness has its own generator, so a study can vary one and hold the others; the proxy's
    initialization follows the init seed). data: uint8 images (N, 32, 32, 3) and labels of 'train'
    and 'test' on the device, 'classes', 'mean', 'std'. net: from build_net, reinitialized and
    trained in place (built when None); the proxy is built anew. on_epoch(figures) gets each
    epoch's figures, untimed (it may raise to stop). Returns the run's figures and net."""
    opt = hyp['opt']
    arch = hyp['net']
    proxy_arch = hyp['proxy']
    batch_size = opt['batch_size']
    epochs = opt['train_epochs']
    masked_count = round(opt['masked_fraction'] * batch_size)
    dtype = torch.float16 if precision == 'fp16' else torch.float32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=(precision == 'bf16'))
    seeds = seed if isinstance(seed, dict) else source_seeds(seed)
    generators = [torch.Generator(device).manual_seed(seeds[key]) for key in ('order', 'aug')]
    loader = CifarLoader(data['train']['images'], data['train']['labels'], batch_size, data['mean'],
                         data['std'], hyp['aug'], dtype, *generators, sampling=opt['sampling'])
    test_images = data['test']['images'].permute(0, 3, 1, 2)
    test_images = loader.normalize(test_images.to(dtype) / 255)
    test_labels = data['test']['labels']
    total_steps = ceil(len(loader) * epochs)
    net = build_net(arch, len(data['classes']), device, precision) if net is None else net
    proxy = build_net(proxy_arch, len(data['classes']), device, precision)
    torch.manual_seed(seeds['init'])
    reinitialize(net, arch['whiten'], arch['identity_init'])
    torch.manual_seed(source_seeds(seeds['init'])['init'])  # the proxy's own, from the init seed
    reinitialize(proxy, arch['whiten'], arch['identity_init'])
    proxy[0].bias.requires_grad = not arch['whiten']  # with whitening, it stays at zero
    groups, proxy_groups = [decoupled_sgd_groups(
        network, opt['lr'], opt['weight_decay'], opt['momentum'], batch_size, opt['bias_scaler'])
        for network in (net, proxy)]
    optimizer = torch.optim.SGD(groups, momentum=opt['momentum'], nesterov=True)
    proxy_optimizer = torch.optim.SGD(proxy_groups, momentum=opt['momentum'], nesterov=True)
    initial_lrs = [group['lr'] for group in optimizer.param_groups]
    lr_multipliers = lr_schedule(total_steps, peak_fraction=opt['lr_peak_fraction'],
                                 end=opt['lr_end']).tolist()
    loss_fn = nn.CrossEntropyLoss(label_smoothing=opt['label_smoothing'], reduction='sum')

    # Timed: the whitening init from the first 5000 training images (the first touch of the data),
    # then the proxy's pass, which selects the examples of every batch the main network trains on
    start_time = synchronized_time(device)
    if arch['whiten']:
        init_whitening(net[0], loader.normalize(loader.images[:5000]), arch['whiten_eps'])
        proxy[0].load_state_dict(net[0].state_dict())
    lookahead = LookaheadState(net) if 0 < opt['lookahead_every'] <= total_steps else None
    selections = select_hardest(proxy, proxy_optimizer, loader, total_steps, lr_multipliers,
                                masked_count, proxy_arch['step_every'], opt['label_smoothing'],
                                autocast)
    total_time_seconds = synchronized_time(device) - start_time

    batches = zip(selections, loader)  # the same stream again, with each batch's selection
    step = 0
    epoch_train_losses = []
    val_acc = None
    for epoch in range(ceil(epochs)):
        net[0].bias.requires_grad = epoch < opt['whiten_bias_epochs'] or not arch['whiten']
        start_time = synchronized_time(device)
        net.train()
        for hardest, (inputs, labels) in islice(batches, len(loader)):
            inputs = inputs[hardest]  # the proxy's hardest examples of the batch
            labels = labels[hardest]
            for group, initial_lr in zip(optimizer.param_groups, initial_lrs):
                group['lr'] = initial_lr * lr_multipliers[step]
            with autocast:
                outputs = net(inputs)
            loss = loss_fn(outputs.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if lookahead is not None and step % opt['lookahead_every'] == 0:
                lookahead.update(net, decay=lookahead_decay(step, total_steps))
            if step >= total_steps:
                if lookahead is not None:  # the live model becomes the slow copy
                    lookahead.update(net, decay=1.0)
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
    logits = infer(net, test_images, arch['tta_level'], autocast)
    total_time_seconds += synchronized_time(device) - start_time
    tta_val_acc = (logits.argmax(1) == test_labels).float().mean().item()
    return dict(seed=seed, seeds=seeds, steps=step, net=net, total_time_seconds=total_time_seconds,
                tta_val_acc=tta_val_acc, val_acc=val_acc, epoch_train_losses=epoch_train_losses)

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
