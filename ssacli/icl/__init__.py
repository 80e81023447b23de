"""The paper's controlled in-context-learning experiments: tasks, model, training, evaluation."""

from ..models.icl import ARCHS, ICLModel, ICLSpec, check_arch, is_icl_checkpoint, load_icl, save_icl
from .evaluate import Cell, cells_to_json, evaluate, outlier_capture, parse_outlier
from .tasks import TASKS, Batch, check_task, every_labels, sample_batch, some_labels
from .train import PRESETS, TrainConfig, resolve_device, train

__all__ = [
    "ARCHS",
    "PRESETS",
    "TASKS",
    "Batch",
    "Cell",
    "ICLModel",
    "ICLSpec",
    "TrainConfig",
    "cells_to_json",
    "check_arch",
    "check_task",
    "evaluate",
    "every_labels",
    "is_icl_checkpoint",
    "load_icl",
    "outlier_capture",
    "parse_outlier",
    "resolve_device",
    "sample_batch",
    "save_icl",
    "some_labels",
    "train",
]
