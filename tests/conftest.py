"""Shared fixtures: the scripts under test (imported as modules) and small synthetic datasets."""
import importlib.util
import os

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ['airbench94', 'airbench94_compiled', 'airbench95', 'airbench96']


def load_script(name):
    """Import REPO/<name>.py as a module (importing must have no side effects)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=SCRIPTS)
def script(request):
    return load_script(request.param)


@pytest.fixture
def ab94():
    return load_script('airbench94')


def write_image_folder(root, num_classes=4, train_per_class=96, test_per_class=32, size=32, seed=0,
                       extension='.png'):
    """An easy synthetic dataset in the image-folder layout: each class has its own mean colour and
    a class-specific stripe, plus noise, so a network can learn it in a few steps."""
    from PIL import Image
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(num_classes, 3, generator=generator) * 160 + 48
    for split, per_class in (('train', train_per_class), ('test', test_per_class)):
        for label in range(num_classes):
            class_dir = os.path.join(root, split, f'class_{label}')
            os.makedirs(class_dir, exist_ok=True)
            for i in range(per_class):
                image = colours[label].view(1, 1, 3) + 40 * torch.randn(size, size, 3, generator=generator)
                stripe = (label * size) // num_classes
                image[:, stripe:stripe + 3] = 255 - image[:, stripe:stripe + 3]
                pixels = image.clamp(0, 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(os.path.join(class_dir, f'{i:04d}{extension}'))
    return root


@pytest.fixture
def image_folder(tmp_path):
    return write_image_folder(str(tmp_path / 'data'))


def tiny_dataset(num_classes=2, per_class=32):
    """An in-memory dataset (the same images for train and test) that a network separates at once:
    class c has pixel values 200c + noise."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    images = (labels.view(-1, 1, 1, 1) * 200 + torch.randint(0, 50, (len(labels), 32, 32, 3),
                                                           generator=generator)).to(torch.uint8)
    split = {'images': images, 'labels': labels}
    return {'train': split, 'test': split, 'classes': [str(c) for c in range(num_classes)],
            'mean': (0.5,) * 3, 'std': (0.25,) * 3}


# Flags for the quickest complete run: one epoch of batches of 32, no warmup, no TTA
TINY = ['--hyp', 'opt.batch_size=32', '--epochs', '1', '--no-warmup', '--no-epoch-eval',
        '--tta-level', '0', '--device', 'cpu']
