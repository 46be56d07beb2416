"""Datasets for training and evaluation: readers, a decoded-array cache, splits, a device loader.

``load_dataset(kind, path)`` reads CIFAR-10 (shared JPEG zips, image folders, python
batches, or the embedded subset), MNIST (5k CSV), BasicMotions (.ts) and FSDD (log-mel
features). ``BatchLoader`` keeps a whole split on the training device and batches,
augments and normalises it there. Importing this package does not import torch.
"""

import hmt.offline_python  # noqa: F401 - refuses Python < 3.10 with a message saying what runs there
from hmt.data.audio import LOG_MEL, LogMelConfig, fit_clip, log_mel_features
from hmt.data.cache import default_cache_dir
from hmt.data.load import load_dataset
from hmt.data.loader import BatchLoader, batches_of, eval_loader
from hmt.data.split import split_train_val, stratified_indices
from hmt.data.types import DATASET_KINDS, Dataset, DatasetInfo, Split

__all__ = [
    "DATASET_KINDS",
    "LOG_MEL",
    "BatchLoader",
    "Dataset",
    "DatasetInfo",
    "LogMelConfig",
    "Split",
    "batches_of",
    "default_cache_dir",
    "eval_loader",
    "fit_clip",
    "load_dataset",
    "log_mel_features",
    "split_train_val",
    "stratified_indices",
]
