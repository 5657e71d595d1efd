"""Every random stream a model may draw from, seeded for one step of the gate and put back after.

The gate compares a candidate's step with the reference's under the same seed. Seeding torch
alone leaves the draws a model makes with Python's `random` or NumPy's global generator:
transformers' SpecAugment (`_compute_mask_indices`, Wav2Vec2/HuBERT in train mode) picks its
masked frames with `np.random`, so two runs of one fp32 model differ by a relative error of 0.44
and no candidate could be judged. Within `seeded(seed)` those streams start from the
seed too. Their states before are restored on exit, so the user's own draws go on as if the gate
had not run; torch's generators are restored too where `keep_torch` is false.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import torch

from advisor.device.ops import cuda_ops

__all__ = ["seeded"]


@contextlib.contextmanager
def seeded(seed: int, keep_torch: bool = False) -> Iterator[None]:
    """torch's (CPU and every CUDA device), Python's and NumPy's global generators from `seed`.
    `keep_torch`: leave torch's generators where the step left them (the caller seeds torch
    itself and owns its state), else fork them and put them back."""
    np = _numpy()
    py_state = random.getstate()
    np_state = np.random.get_state() if np is not None else None
    # CUDA's generators are forked only where CUDA is already up (forking starts it otherwise)
    cuda = cuda_ops().started()
    fork = contextlib.nullcontext() if keep_torch else torch.random.fork_rng(devices=cuda)
    try:
        with fork:
            torch.manual_seed(seed)
            random.seed(seed)
            if np is not None:
                np.random.seed(seed % 2**32)
            yield
    finally:
        random.setstate(py_state)
        if np is not None:
            np.random.set_state(np_state)


def _numpy():  # noqa: ANN202 - the numpy module or None
    try:
        import numpy
    except ImportError:  # torch runs without NumPy; then no model draws from it
        return None
    return numpy
