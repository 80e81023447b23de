"""The worker of tests/train/test_monitor.py's two-process test, in a module of its own so that the spawned
children import only what it needs (not transformers' Trainer)."""

from __future__ import annotations

import datetime
import json
import os

import torch

import ssacli
from ssacli.train.monitor import SaturationMonitor, all_ranks_agree


def two_rank_worker(rank: int, port: int, folder: str, probe: str) -> None:
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        loaded = ssacli.load_model(folder, device="cpu")
        monitor = SaturationMonitor(every=2, probes=["key-scale:1,8"], samples=2, length=16)
        # Rank 1 cannot measure at step 2: neither rank may run the probe forward there.
        for step in range(7):
            monitor.log(step, loaded.model, loaded.tokenizer, ready=not (rank == 1 and step == 2))
        agreed = [all_ranks_agree(rank == 0), all_ranks_agree(True)]
        with open(os.path.join(probe, f"rank{rank}.json"), "w") as file:
            json.dump({"history": monitor.history, "agreed": agreed}, file)
    finally:
        torch.distributed.destroy_process_group()
