"""CIFAR-10-C-style corruptions (Hendrycks & Dietterich 2019) and the shift-set artifact.

The six corruptions the adaptation benchmark uses, with the published CIFAR-10-C
parameters per severity 1..5 (``make_cifar_c.py`` of the CIFAR-10-C release), written
without OpenCV or scikit-image: the disk kernel's 3x3 Gaussian alias blur and the
reflect-101 border of ``cv2.filter2D`` are reproduced with numpy/scipy, the HSV round
trip with matplotlib. Randomness (the two noises) comes from a ``numpy.random.Generator``
passed in, so the same seed gives the same images.

A shift set is an artifact directory of kind ``shift-set``: ``labels.npy`` (int64) and
one ``<corruption>-s<severity>.npy`` (uint8, N x 3 x 32 x 32) per corruption and
severity, plus ``clean.npy``; ``load_shift_set`` verifies every sha256 before reading.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np

from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.errors import ArtifactError, UsageError
from hmt.progress import ProgressCallback, no_progress

SHIFT_SET_KIND = "shift-set"
LABELS_NAME = "labels.npy"
CLEAN_NAME = "clean"
SEVERITIES = (1, 2, 3, 4, 5)

# CIFAR-10-C parameters, indexed by severity - 1.
_GAUSSIAN_STD = (0.04, 0.06, 0.08, 0.09, 0.10)
_SHOT_RATE = (500.0, 250.0, 100.0, 75.0, 50.0)
_DEFOCUS = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))  # (disk radius px, alias blur sigma)
_BRIGHTNESS = (0.05, 0.1, 0.15, 0.2, 0.3)
_CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)
_JPEG_QUALITY = (80, 65, 58, 50, 40)

Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]
"""(float images N x H x W x 3 in [0, 1], severity, rng) -> float images in [0, 1]."""


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    return np.clip(x + rng.normal(size=x.shape, scale=_GAUSSIAN_STD[severity - 1]), 0.0, 1.0)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    rate = _SHOT_RATE[severity - 1]
    return np.clip(rng.poisson(x * rate) / rate, 0.0, 1.0)


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """CIFAR-10-C's defocus kernel: an aliased disk on a 17 x 17 grid (radius <= 8),
    blurred by a 3 x 3 Gaussian (cv2.GaussianBlur, reflect-101 border), normalised."""
    from scipy.ndimage import correlate1d

    size = 8 if radius <= 8 else int(np.ceil(radius))
    grid = np.arange(-size, size + 1)
    xx, yy = np.meshgrid(grid, grid)
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    taps = np.exp(-(np.arange(-1, 2) ** 2) / (2.0 * alias_blur**2))
    taps /= taps.sum()
    blurred = correlate1d(correlate1d(disk, taps, axis=0, mode="mirror"), taps, axis=1, mode="mirror")
    return blurred


def defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    from scipy.ndimage import correlate

    del rng
    kernel = disk_kernel(*_DEFOCUS[severity - 1])
    # cv2.filter2D correlates with a reflect-101 border, which is scipy's "mirror" mode.
    out = np.empty_like(x)
    for n in range(x.shape[0]):
        for c in range(x.shape[3]):
            out[n, :, :, c] = correlate(x[n, :, :, c], kernel, mode="mirror")
    return np.clip(out, 0.0, 1.0)


def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    from matplotlib.colors import hsv_to_rgb, rgb_to_hsv

    del rng
    hsv = rgb_to_hsv(x)
    hsv[..., 2] = np.clip(hsv[..., 2] + _BRIGHTNESS[severity - 1], 0.0, 1.0)
    return np.clip(hsv_to_rgb(hsv), 0.0, 1.0)


def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    del rng
    means = x.mean(axis=(1, 2), keepdims=True)
    return np.clip((x - means) * _CONTRAST[severity - 1] + means, 0.0, 1.0)


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    del rng
    out = np.empty_like(x)
    pixels = np.round(x * 255.0).astype(np.uint8)
    for n in range(x.shape[0]):
        buffer = io.BytesIO()
        Image.fromarray(pixels[n]).save(buffer, format="JPEG", quality=_JPEG_QUALITY[severity - 1])
        buffer.seek(0)
        with Image.open(buffer) as image:
            out[n] = np.asarray(image, dtype=np.float64) / 255.0
    return out


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "defocus_blur": defocus_blur,
    "brightness": brightness,
    "contrast": contrast,
    "jpeg_compression": jpeg_compression,
}
# The groups the target speaks of ("noise and blur at severity 5").
NOISE_AND_BLUR = ("gaussian_noise", "shot_noise", "defocus_blur")


def corrupt(images: np.ndarray, name: str, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Corrupt uint8 ``(N, 3, H, W)`` images; returns uint8 of the same shape."""
    if name not in CORRUPTIONS:
        raise UsageError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise UsageError(f"severity must be one of {SEVERITIES}, got {severity}")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise UsageError(f"images must be uint8 (N, 3, H, W), got {images.dtype} {images.shape}")
    hwc = images.transpose(0, 2, 3, 1).astype(np.float64) / 255.0
    out = CORRUPTIONS[name](hwc, severity, rng)
    # Rounded, as the published set saves 8-bit images.
    return np.ascontiguousarray(np.round(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8).transpose(0, 3, 1, 2))


def _corrupt_job(job: tuple[np.ndarray, str, int, np.random.SeedSequence]) -> np.ndarray:
    images, name, severity, seed = job
    return corrupt(images, name, severity, np.random.default_rng(seed))


def set_name(corruption: str, severity: int) -> str:
    return f"{corruption}-s{severity}"


def write_shift_set(
    out: Path,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    corruptions: Iterable[str],
    severities: Iterable[int],
    seed: int,
    source: dict[str, str],
    progress: ProgressCallback = no_progress,
    workers: int = 1,
) -> list[str]:
    """Write the clean images and every (corruption, severity) as a shift-set artifact.

    Each set draws from its own generator, spawned from ``seed`` in a fixed order, so
    one set can be rebuilt without the others and adding a corruption changes no other;
    ``workers`` processes make sets in parallel with the same result as one.
    """
    corruptions = list(corruptions)
    severities = list(severities)
    pairs = [(c, s) for c in corruptions for s in severities]
    children = np.random.SeedSequence(seed).spawn(len(CORRUPTIONS) * len(SEVERITIES))
    names = []
    # The source's dataset by name (with its sha256): a path of this machine means nothing elsewhere.
    named = {**source, "dataset": PurePath(source["dataset"]).name} if "dataset" in source else dict(source)
    config = {"seed": seed, "corruptions": corruptions, "severities": severities, "source": named,
              "count": len(labels)}
    with ArtifactWriter(out, kind=SHIFT_SET_KIND, config=config) as writer:
        np.save(writer.path(LABELS_NAME), labels.astype(np.int64), allow_pickle=False)
        np.save(writer.path(f"{CLEAN_NAME}.npy"), images, allow_pickle=False)
        jobs = [(images, name, severity, children[list(CORRUPTIONS).index(name) * len(SEVERITIES) + severity - 1])
                for name, severity in pairs]
        if workers > 1 and len(jobs) > 1:
            import concurrent.futures
            import multiprocessing

            context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                                  else "spawn")
            with concurrent.futures.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
                results = pool.map(_corrupt_job, jobs)
                for k, ((name, severity), made) in enumerate(zip(pairs, results, strict=True)):
                    np.save(writer.path(f"{set_name(name, severity)}.npy"), made, allow_pickle=False)
                    names.append(set_name(name, severity))
                    progress("corrupt", k + 1, len(pairs), set_name(name, severity))
        else:
            for k, job in enumerate(jobs):
                name, severity = job[1], job[2]
                np.save(writer.path(f"{set_name(name, severity)}.npy"), _corrupt_job(job), allow_pickle=False)
                names.append(set_name(name, severity))
                progress("corrupt", k + 1, len(pairs), set_name(name, severity))
        writer.metrics["sets"] = [CLEAN_NAME, *names]
    return names


@dataclass(frozen=True)
class ShiftSet:
    """A verified shift set: ``sets`` maps a set name (``clean``, ``gaussian_noise-s5``)
    to its uint8 images; every set shares ``labels``."""

    root: Path
    labels: np.ndarray
    sets: dict[str, np.ndarray]


def load_shift_set(path: Path | str, *, names: Iterable[str] | None = None) -> ShiftSet:
    """Load (checksums verified) the named sets of a shift-set artifact, or all of them."""
    artifact = load_artifact(path, kind=SHIFT_SET_KIND)
    available = [str(n) for n in artifact.manifest.metrics.get("sets", [])]
    wanted = list(names) if names is not None else available
    unknown = [n for n in wanted if n not in available]
    if unknown:
        raise UsageError(f"{artifact.root}: holds no set {unknown[0]!r}; it holds {', '.join(available)}")
    labels = _load_npy(artifact.root / LABELS_NAME, artifact.file(LABELS_NAME))
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or labels.size == 0 or labels.min() < 0:
        raise ArtifactError(f"{artifact.root / LABELS_NAME}: {labels.dtype} {labels.shape}; expected at least one "
                            "class index, an integer >= 0 per image (N,)")
    sets = {}
    for name in wanted:
        x = _load_npy(artifact.root / f"{name}.npy", artifact.file(f"{name}.npy"))
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[0] != labels.shape[0] or x.shape[1] != 3:
            raise ArtifactError(f"{artifact.root / (name + '.npy')}: {x.dtype} {x.shape}; expected uint8 "
                                f"({labels.shape[0]}, 3, H, W)")
        sets[name] = x
    return ShiftSet(root=artifact.root, labels=labels, sets=sets)


def _load_npy(where: Path, path: Path) -> np.ndarray:
    """One array of a shift set; an object array (it would need pickle) or a malformed file is refused."""
    try:
        array: np.ndarray = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ArtifactError(f"{where}: not a plain .npy array ({exc})") from exc
    return array
