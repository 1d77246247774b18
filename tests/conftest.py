"""Shared fixtures: the scripts under test (imported as modules) and small synthetic datasets."""
import importlib.util
import os

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ['airbench94', 'airbench95', 'airbench96']


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
