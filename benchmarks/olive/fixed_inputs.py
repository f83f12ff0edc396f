"""Olive user script: a dataset of fixed-shape inputs saved by ortpilot (benchmarks/bench_olive.py).

Olive's ``tune-session-params`` CLI feeds a (1, 1) tensor named "input"; this dataset instead
returns the exact feeds ortpilot measures with (same names, shapes, dtypes and values), one
sample per item, already batched (use it with Olive's ``no_auto_batch_dataloader``).
"""

import numpy as np
from olive.data.registry import Registry


class FixedInputs:
    def __init__(self, path, repeat=32):
        with np.load(path) as data:
            self.feeds = {name: data[name] for name in data.files}
        self.repeat = int(repeat)

    def __len__(self):
        return self.repeat

    def __getitem__(self, index):
        if index < 0 or index >= self.repeat:
            raise IndexError("index out of range")
        return dict(self.feeds), 0


@Registry.register_dataset()
def ortpilot_fixed_inputs(path, repeat=32, **kwargs):
    return FixedInputs(path, repeat)
