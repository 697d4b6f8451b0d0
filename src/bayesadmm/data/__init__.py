"""Data sets used by the experiments."""

from bayesadmm.data.images import (
    DATASETS,
    DatasetNotFoundError,
    IdxFormatError,
    class_pair_split,
    downsample,
    load_image_dataset,
    read_idx,
)

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "IdxFormatError",
    "class_pair_split",
    "downsample",
    "load_image_dataset",
    "read_idx",
]
