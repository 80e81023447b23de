"""What a fine-tuning run (:mod:`ssacli.train.finetune`) sets up around its step loop, outside the optimizer.

* :class:`Distributed`: the process's place in a launcher's process group (torchrun, accelerate
  launch: ``WORLD_SIZE`` > 1 starts it, gloo on CPU, nccl on CUDA), with the collectives the loop
  uses: a decision made on rank 0 and shared, a sum over ranks, a barrier.
* :class:`StopSignals`: SIGINT/SIGTERM set a flag the loop checks after each step, so an interrupt
  ends in a checkpoint; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import SsacliError


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    created: bool = False

    @classmethod
    def start(cls) -> Distributed:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        created = not dist.is_initialized()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if created:
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_device(local)
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), local, created)

    def decide(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on rank 0 only and give every rank its result, or its SsacliError."""
        if self.world == 1:
            return fn()
        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box = [(True, fn())]
            except SsacliError as err:
                box = [(False, err)]
        dist.broadcast_object_list(box, src=0)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return tensor
        tensor = tensor.cuda() if dist.get_backend() == "nccl" else tensor  # nccl reduces CUDA tensors only
        dist.all_reduce(tensor)
        return tensor.cpu()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.created:
            dist.destroy_process_group()


class StopSignals:
    """SIGINT/SIGTERM set a flag the loop checks after each step; a second Ctrl-C stops at once.

    Not in a multiprocessing worker (a parallel study's runs): its pool ends it with SIGTERM and
    then waits, so a worker that only noted the signal would finish its step and then wait for
    work forever; there the signals keep their default effect and the run resumes from its last
    checkpoint."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        worker = multiprocessing.parent_process() is not None
        if threading.current_thread() is threading.main_thread() and not worker:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


__all__ = ["Distributed", "StopSignals"]
