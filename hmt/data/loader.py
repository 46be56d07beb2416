"""A batch loader that keeps a whole split on the training device.

The split is uploaded once; every batch is an index into it, augmented and normalised
on that device with a few whole-batch tensor ops, so the per-batch cost is a handful of
kernel launches and never a Python loop over samples or a host-to-device copy.

Order and augmentation are functions of (the generator's seed, the epoch, the rank):
``set_epoch(e)`` before iterating reproduces epoch ``e`` exactly (resume after a kill),
and every DDP rank, built from a generator with the same seed, draws the same
permutation and takes a disjoint shard of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from hmt.data.types import DatasetInfo, expected_dtype
from hmt.errors import UsageError

if TYPE_CHECKING:
    import torch

# Separate random streams per purpose, so that turning augmentation on or off never
# changes the shuffle order.
_STREAM_ORDER = 0
_STREAM_AUGMENT = 1
_SEED_MASK = (1 << 63) - 1


def _derive_seed(*words: int) -> int:
    return int(np.random.SeedSequence([w & _SEED_MASK for w in words]).generate_state(1, np.uint64)[0]) & _SEED_MASK


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror indices in [-(size-1), 2(size-1)] back into [0, size-1] without repeating the edge.

    The same rule as ``torch.nn.functional.pad(mode="reflect")``, applied to indices so
    a padded crop becomes one gather and the padded image is never materialised.
    """
    last = size - 1
    return last - (last - index.abs()).abs()


class BatchLoader:
    """Batches ``(x, y)`` on ``device``: xb float32 normalised with ``info``, yb int64.

    - images (``info.modality == "image"``, x uint8 N,C,H,W): with ``augment``, a random
      crop from the image padded by ``crop_padding_px`` on each side in reflect mode,
      then a horizontal flip with probability 1/2. ``channels_last`` returns batches in
      that memory format.
    - sequences (x float N,C,L): with ``augment``, a random time shift of up to
      ``max_shift_steps`` (default 10% of L) either way, the vacated steps repeating the
      edge value (not zeros: a zero in raw units is not silence for log-mel features).
    - ``shuffle``: a new permutation each epoch; otherwise the original order.
    - DDP: ``rank``/``world_size`` give this rank a disjoint shard (``perm[rank::world_size]``)
      of the epoch's permutation. Without ``drop_last`` the permutation is first padded by
      wrapping to a multiple of ``world_size`` (as ``DistributedSampler`` does) so every
      rank has the same number of batches; up to ``world_size - 1`` samples then appear
      twice in an epoch. With ``drop_last`` the tail is dropped instead, and so is a
      final short batch.
    - Randomness comes from ``generator.initial_seed()`` and the epoch, never from the
      generator's running state, so the order does not depend on what else drew from
      it. Iterating runs the current epoch and advances it by one; ``set_epoch`` sets it.
    """

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        info: DatasetInfo,
        batch_size: int,
        device: torch.device | str,
        augment: bool,
        shuffle: bool,
        generator: torch.Generator,
        drop_last: bool = False,
        channels_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        crop_padding_px: int = 4,
        max_shift_steps: int | None = None,
    ) -> None:
        import torch

        if batch_size < 1:
            raise UsageError(f"batch_size {batch_size} must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} / world_size {world_size}: expected 0 <= rank < world_size")
        if x.ndim != len(info.input_shape) + 1 or tuple(x.shape[1:]) != info.input_shape:
            raise UsageError(f"x has shape {x.shape}; {info.name} samples are {info.input_shape}")
        if len(y) != len(x):
            raise UsageError(f"x has {len(x)} samples but y has {len(y)}")
        if info.modality == "image" and x.dtype != np.uint8:
            raise UsageError(f"image x must be uint8 (as load_dataset returns it), got {x.dtype}")
        if channels_last and info.modality != "image":
            raise UsageError("channels_last applies to image data only")
        length = info.input_shape[-1]
        if info.modality == "image" and not 0 <= crop_padding_px < min(info.input_shape[1:]):
            raise UsageError(f"crop_padding_px {crop_padding_px} must be in 0..{min(info.input_shape[1:]) - 1}")
        if max_shift_steps is None:
            max_shift_steps = length // 10
        if not 0 <= max_shift_steps < length:
            raise UsageError(f"max_shift_steps {max_shift_steps} must be in 0..{length - 1}")

        self.info = info
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.augment = augment
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.channels_last = channels_last
        self.rank = rank
        self.world_size = world_size
        self.crop_padding_px = crop_padding_px
        self.max_shift_steps = max_shift_steps
        self._base_seed = int(generator.initial_seed())
        self._epoch = 0

        host_x = np.ascontiguousarray(x, dtype=expected_dtype(info))
        host_y = np.ascontiguousarray(y, dtype=np.int64)
        # from_numpy shares memory; a read-only array (a cache entry, a view) is copied first
        # because torch may not alias memory it cannot write.
        self._x = torch.from_numpy(host_x if host_x.flags.writeable else host_x.copy()).to(self.device)
        self._y = torch.from_numpy(host_y if host_y.flags.writeable else host_y.copy()).to(self.device)
        channels = info.num_channels
        std = torch.tensor(info.std, dtype=torch.float64)
        mean = torch.tensor(info.mean, dtype=torch.float64)
        # Normalising is one multiply-add: (x / 255 - mean) / std == x * scale + shift.
        pixel_range = 255.0 if info.modality == "image" else 1.0
        view = (1, channels, 1, 1) if info.modality == "image" else (1, channels, 1)
        self._scale = (1.0 / (pixel_range * std)).to(torch.float32).view(view).to(self.device)
        self._shift = (-mean / std).to(torch.float32).view(view).to(self.device)

    # -- sizes and order ------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples this rank sees in one epoch (including wrap-around padding)."""
        total = len(self._y)
        if self.world_size == 1:
            return total
        if self.drop_last:
            return total // self.world_size
        return -(-total // self.world_size)

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch``: its order and augmentation, exactly."""
        if epoch < 0:
            raise UsageError(f"epoch {epoch} must be >= 0")
        self._epoch = epoch

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices for ``epoch`` (default: the next one), in batch order."""
        return self._order(self._epoch if epoch is None else epoch).numpy()

    def _order(self, epoch: int) -> torch.Tensor:
        import torch

        total = len(self._y)
        if self.shuffle:
            host_gen = torch.Generator().manual_seed(_derive_seed(self._base_seed, epoch, _STREAM_ORDER))
            order = torch.randperm(total, generator=host_gen)
        else:
            order = torch.arange(total)
        if self.world_size > 1 and total:
            if self.drop_last:
                order = order[: (total // self.world_size) * self.world_size]
            else:
                padded = -(-total // self.world_size) * self.world_size
                order = torch.cat([order, order[: padded - total]]) if padded > total else order
                while len(order) < padded:  # fewer samples than ranks: wrap more than once
                    order = torch.cat([order, order[: padded - len(order)]])
            order = order[self.rank :: self.world_size]
        return order

    # -- batches --------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        epoch = self._epoch
        self._epoch += 1
        order = self._order(epoch).to(self.device)
        aug_gen: torch.Generator | None = None
        if self.augment:
            aug_gen = torch.Generator(device=self.device)
            aug_gen.manual_seed(_derive_seed(self._base_seed, epoch, _STREAM_AUGMENT, self.rank))
        for number in range(len(self)):
            index = order[number * self.batch_size : (number + 1) * self.batch_size]
            yield self._batch(index, aug_gen)

    def _batch(self, index: torch.Tensor, aug_gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        labels = self._y.index_select(0, index)
        if self.info.modality == "image":
            if aug_gen is not None:
                raw = self._crop_flip(index, aug_gen)
            else:
                raw = self._x.index_select(0, index)
                if self.channels_last:
                    raw = raw.contiguous(memory_format=torch.channels_last)
        else:
            raw = self._x.index_select(0, index)
            if aug_gen is not None and self.max_shift_steps > 0:
                raw = self._shift_time(raw, aug_gen)
        # addcmul keeps the memory format of `raw` (channels_last stays channels_last).
        return torch.addcmul(self._shift, raw.to(torch.float32), self._scale), labels

    def _crop_flip(self, index: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Padded random crop + horizontal flip of uint8 images, as one gather."""
        import torch

        batch = len(index)
        _, height, width = self.info.input_shape
        pad = self.crop_padding_px
        dev = self.device
        dy = torch.randint(-pad, pad + 1, (batch, 1), generator=gen, device=dev)
        dx = torch.randint(-pad, pad + 1, (batch, 1), generator=gen, device=dev)
        flip = torch.randint(0, 2, (batch, 1), generator=gen, device=dev).bool()
        rows = _reflect(torch.arange(height, device=dev) + dy, height)
        cols = _reflect(torch.arange(width, device=dev) + dx, width)
        # A flip after the crop reads the crop's columns right to left.
        cols = torch.where(flip, cols.flip(1), cols)
        # One gather over flattened pixels, the same source pixel for every channel: on
        # CPU this measured 3x faster than 4-D advanced indexing and 2x faster than
        # gathering rows then columns.
        pixels = (rows[:, :, None] * width + cols[:, None, :]).view(batch, 1, height * width)
        picked = self._x.index_select(0, index).view(batch, -1, height * width)
        out = picked.gather(2, pixels.expand(-1, picked.shape[1], -1)).view(batch, -1, height, width)
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out

    def _shift_time(self, raw: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        import torch

        batch, channels, length = raw.shape
        limit = self.max_shift_steps
        shift = torch.randint(-limit, limit + 1, (batch, 1), generator=gen, device=self.device)
        steps = (torch.arange(length, device=self.device) + shift).clamp_(0, length - 1)
        return raw.gather(2, steps[:, None, :].expand(batch, channels, length))


def eval_loader(
    x: np.ndarray,
    y: np.ndarray | None,
    *,
    info: DatasetInfo,
    batch_size: int,
    device: torch.device | str,
    channels_last: bool,
) -> BatchLoader:
    """A loader for evaluation or calibration: in order, no augmentation (labels optional)."""
    import torch

    labels = np.zeros(len(x), dtype=np.int64) if y is None else y
    return BatchLoader(
        x,
        labels,
        info=info,
        batch_size=batch_size,
        device=device,
        augment=False,
        shuffle=False,
        generator=torch.Generator().manual_seed(0),
        channels_last=channels_last,
    )


def batches_of(loader: BatchLoader) -> list[torch.Tensor]:
    """Every input batch of ``loader``'s first epoch, in order (labels dropped)."""
    loader.set_epoch(0)
    return [xb for xb, _ in loader]
