"""A study's data: CIFAR-10, CIFAR-100 and SVHN in torchvision's layout (downloaded when absent) or
any image folder of 32x32 images, decoded once into a tensor cache beside it, with the fingerprint
every process compares. The scripts' tail (repository_tail) reads CIFAR-10 and image folders, with
its messages for bad data, and normalizes (CIFAR-10's constants, else the training set's own)."""
import hashlib
import io
import os

import torch

from .errors import StorageError, StudyError
from .files import atomic_write
from .scripts import repository_tail

DATASETS = ('cifar10', 'cifar100', 'svhn', 'folder')
CACHE_VERSION = 2  # a cache of another version is rebuilt


def tail_call(function, *args):
    """A function of the scripts' tail, its ValueError (bad data, a script's words) a StudyError."""
    try:
        return function(*args)
    except ValueError as error:
        raise StudyError(str(error)) from None


def read_image_folder(data_dir, train_splits):
    """The training splits of data_dir (concatenated) and its test/, all with the same classes."""
    tail = repository_tail()
    splits = {split: tail_call(tail.read_split, data_dir, split) for split in
              [*train_splits, 'test']}
    tail_call(tail.check_same_classes, data_dir, {split: classes for split, (_, classes) in
                                                  splits.items()})
    return {'train': {key: torch.cat([splits[s][0][key] for s in train_splits])
                      for key in ('images', 'labels')},
            'test': splits['test'][0], 'classes': splits['test'][1]}


def read_torchvision_dataset(name, data_dir, download):
    """CIFAR-100 or SVHN in torchvision's layout (CIFAR-10 is the scripts' load_cifar10)."""
    import torchvision
    data = {}
    for split in ('train', 'test'):
        if name == 'svhn':
            dataset = torchvision.datasets.SVHN(data_dir, split=split, download=download)
            images = torch.from_numpy(dataset.data).permute(0, 2, 3, 1)
            labels = dataset.labels
        else:
            dataset = getattr(torchvision.datasets, name.upper())(data_dir, split == 'train',
                                                                  download=download)
            images = torch.from_numpy(dataset.data)
            labels = dataset.targets
        data[split] = {'images': images.contiguous(), 'labels': torch.as_tensor(labels).long()}
    return {**data, 'classes': list(map(str, range(10))) if name == 'svhn' else dataset.classes}


def source_of(name, data_dir, splits):
    """What a cache must have been made from: the dataset, the splits and, for an image folder,
    its file count, total size and latest change (a folder that changed is decoded again)."""
    folder = repository_tail().image_folder_error(data_dir, splits) is None
    files = [os.stat(os.path.join(root, file)) for split in splits if folder
             for root, _, names in os.walk(os.path.join(data_dir, split)) for file in names]
    return dict(version=CACHE_VERSION, dataset=name, train_splits=splits[:-1], fingerprint=[
        len(files), sum(f.st_size for f in files), max((f.st_mtime_ns for f in files), default=0)]
                if folder else None)


def read_cache(cache_path, source, log):
    """The cached data if it was made from source, else None (saying why)."""
    if not os.path.exists(cache_path):
        return None
    try:
        data = torch.load(cache_path, map_location='cpu', weights_only=True)
    except Exception as error:
        log(f'The tensor cache {cache_path} is unreadable ({error}); rebuilding it.')
        return None
    stale = [key for key, value in source.items() if data.get(key) != value]
    if stale:
        log(f'The tensor cache {cache_path} does not match this data ({", ".join(stale)} '
            'differ); rebuilding it.')
        return None
    return data


def write_cache(cache_path, data, log):
    buffer = io.BytesIO()
    torch.save(data, buffer)
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        atomic_write(cache_path, buffer.getvalue())
    except (OSError, StorageError) as error:  # a full disk or a read-only directory: go on without
        log(f'Could not write the tensor cache {cache_path} ({error}); continuing without it.')


def load_study_data(name, data_dir, train_splits=('train',), download=True, log=print):
    """{'train': {'images': uint8 (N, 32, 32, 3), 'labels'}, 'test', 'classes', 'mean', 'std'} from
    data_dir's tensor cache where it matches, else from its image-folder or torchvision layout
    (downloaded when absent), then cached. mean, std: CIFAR-10's constants, else the training
    set's own."""
    cache_path = os.path.join(data_dir, 'airbench_cache.pt')
    splits = [*train_splits, 'test']
    source = source_of(name, data_dir, splits)
    data = read_cache(cache_path, source, log)
    if data is not None:
        return data
    if source['fingerprint'] is not None:
        log(f'Decoding the image-folder dataset in {data_dir} (done once, then cached) ...')
        data = read_image_folder(data_dir, list(train_splits))
    elif name == 'folder':
        raise StudyError(str(repository_tail().image_folder_error(data_dir, splits)))
    elif name == 'cifar10':
        data = tail_call(repository_tail().load_cifar10, data_dir, download)
    else:
        try:
            data = read_torchvision_dataset(name, data_dir, download)
        except Exception as error:
            raise StudyError(
                f'No {name} dataset found in {os.path.abspath(data_dir)} and it could not be '
                f'downloaded ({type(error).__name__}: {error}). Run once with network access (it '
                f"is downloaded there), or put torchvision's files for {name} there, or point "
                '--data-dir at an image-folder layout: train/<class>/*, test/<class>/* images.'
            ) from None
    if name == 'cifar10':  # CIFAR-10's constants, whatever its layout
        data['mean'] = repository_tail().CIFAR10_MEAN
        data['std'] = repository_tail().CIFAR10_STD
    else:
        data['mean'], data['std'] = repository_tail().mean_and_std(data['train']['images'])
    data.update(source)
    write_cache(cache_path, data, log)
    return data


def data_fingerprint(data):
    """SHA-256 of the images and labels: processes that differ in it see different data."""
    digest = hashlib.sha256()
    for split in ('train', 'test'):
        for key in ('images', 'labels'):
            digest.update(data[split][key].cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
