"""Data sets used by the experiments."""

from bayesadmm.data.cifar import CIFAR_DATASETS, CifarFormatError, load_cifar
from bayesadmm.data.images import (
    DATASETS,
    DatasetNotFoundError,
    IdxFormatError,
    class_pair_split,
    downsample,
    load_image_dataset,
    read_idx,
)
from bayesadmm.data.partitions import PARTITIONS, make_partition

__all__ = [
    "CIFAR_DATASETS",
    "CifarFormatError",
    "DATASETS",
    "DatasetNotFoundError",
    "IdxFormatError",
    "PARTITIONS",
    "class_pair_split",
    "downsample",
    "load_cifar",
    "load_image_dataset",
    "make_partition",
    "read_idx",
]
