"""Free Spoken Digit Dataset and the log-mel features computed from it.

The features are plain numpy so that ``serve`` can compute exactly the same ones on a
device without torch: ``log_mel_features(waveform)`` is the whole recipe.
"""

from __future__ import annotations

import io
import re
import wave
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hmt.data.source import Source
from hmt.data.types import Dataset, DatasetInfo
from hmt.errors import InputError
from hmt.progress import ProgressCallback

_NAME = re.compile(r"^(?P<digit>[0-9])_(?P<speaker>[A-Za-z]+)_(?P<index>[0-9]+)\.wav$")
FSDD_ZIP = "recordings.zip"
FSDD_DIR = "recordings"
# The FSDD README's split: recordings 0-4 of each speaker and digit are the test set.
FSDD_TEST_MAX_INDEX = 4
_CHUNK_CLIPS = 256
_PROGRESS_EVERY = 500


@dataclass(frozen=True)
class LogMelConfig:
    """The feature recipe; every field is part of the cache key."""

    sample_rate_hz: int = 8000
    clip_s: float = 1.0
    n_fft: int = 256
    hop_samples: int = 80
    n_mels: int = 40
    fmin_hz: float = 0.0
    fmax_hz: float = 4000.0
    log_floor: float = 1e-6

    @property
    def clip_samples(self) -> int:
        return round(self.sample_rate_hz * self.clip_s)

    @property
    def n_frames(self) -> int:
        # Frames are centred (n_fft // 2 zeros each side), as librosa and torchaudio do.
        return 1 + self.clip_samples // self.hop_samples


LOG_MEL = LogMelConfig()


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(config: LogMelConfig = LOG_MEL) -> np.ndarray:
    """Triangular filters on the HTK mel scale, unit peak: (n_mels, n_fft // 2 + 1)."""
    bin_hz = np.linspace(0.0, config.sample_rate_hz / 2, config.n_fft // 2 + 1)
    edges_mel = np.linspace(
        _hz_to_mel(np.array(config.fmin_hz)), _hz_to_mel(np.array(config.fmax_hz)), config.n_mels + 2
    )
    edges_hz = _mel_to_hz(edges_mel)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bin_hz[None, :] - lower) / (centre - lower)
    falling = (upper - bin_hz[None, :]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def fit_clip(waveform: np.ndarray, config: LogMelConfig = LOG_MEL) -> np.ndarray:
    """Zero-pad or crop to ``clip_s``, keeping the middle.

    FSDD clips are trimmed close to the spoken word, so the middle of a long clip holds
    the most of it and padding both sides keeps short words centred like long ones.
    """
    target = config.clip_samples
    length = waveform.shape[-1]
    if length >= target:
        start = (length - target) // 2
        return waveform[..., start : start + target]
    before = (target - length) // 2
    pad = [(0, 0)] * (waveform.ndim - 1) + [(before, target - length - before)]
    return np.pad(waveform, pad)


def log_mel_features(waveforms: np.ndarray, config: LogMelConfig = LOG_MEL) -> np.ndarray:
    """Log-mel spectrogram of float waveforms in [-1, 1] already fitted to ``clip_s``.

    ``(..., clip_samples)`` -> float32 ``(..., n_mels, n_frames)``: centred frames, periodic
    Hann window, power spectrum, mel filterbank, natural log with a floor.
    """
    if waveforms.shape[-1] != config.clip_samples:
        raise InputError(f"waveform has {waveforms.shape[-1]} samples; expected {config.clip_samples} (use fit_clip)")
    half = config.n_fft // 2
    padded = np.pad(waveforms.astype(np.float32), [(0, 0)] * (waveforms.ndim - 1) + [(half, half)])
    frames = np.lib.stride_tricks.sliding_window_view(padded, config.n_fft, axis=-1)[..., :: config.hop_samples, :]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(config.n_fft) / config.n_fft)).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    mel = power @ mel_filterbank(config).T.astype(np.float32)
    return np.log(np.maximum(mel, config.log_floor)).swapaxes(-1, -2).astype(np.float32)


def read_wav(blob: bytes, where: str, config: LogMelConfig = LOG_MEL) -> np.ndarray:
    """Mono 16-bit PCM at ``sample_rate_hz`` -> float32 in [-1, 1]."""
    try:
        with wave.open(io.BytesIO(blob)) as reader:
            channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise InputError(f"{where}: not a readable WAV file ({exc})") from exc
    if (channels, width, rate) != (1, 2, config.sample_rate_hz):
        raise InputError(
            f"{where}: {channels} channel(s), {8 * width}-bit, {rate} Hz; "
            f"expected mono 16-bit PCM at {config.sample_rate_hz} Hz"
        )
    if not frames:
        raise InputError(f"{where}: holds no samples")
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0


def _parse_name(name: str, where: str) -> tuple[int, bool]:
    """(digit, is_test) of ``recordings/<digit>_<speaker>_<index>.wav``."""
    match = _NAME.match(name.rsplit("/", 1)[-1])
    if match is None:
        raise InputError(f"{where}: entry {name!r} is not named <digit>_<speaker>_<index>.wav")
    return int(match["digit"]), int(match["index"]) <= FSDD_TEST_MAX_INDEX


def _features(blobs: list[tuple[str, bytes]], where: str, progress: ProgressCallback) -> np.ndarray:
    out = np.empty((len(blobs), LOG_MEL.n_mels, LOG_MEL.n_frames), dtype=np.float32)
    for start in range(0, len(blobs), _CHUNK_CLIPS):
        chunk = blobs[start : start + _CHUNK_CLIPS]
        clips = np.stack([fit_clip(read_wav(blob, f"{where}: entry {name!r}")) for name, blob in chunk])
        out[start : start + len(chunk)] = log_mel_features(clips)
        progress("fsdd log-mel features", start + len(chunk), len(blobs))
    return out


def _read_recordings(location: Path) -> list[tuple[str, bytes]]:
    if location.is_dir():
        files = sorted(p for p in location.iterdir() if p.is_file() and not p.name.startswith("."))
        try:
            return [(f"{FSDD_DIR}/{p.name}", p.read_bytes()) for p in files]
        except OSError as exc:
            raise InputError(f"{location}: cannot read a recording ({exc})") from exc
    try:
        archive = zipfile.ZipFile(location)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"{location}: not a readable zip archive ({exc}); expected recordings/*.wav") from exc
    blobs: list[tuple[str, bytes]] = []
    with archive:
        for member in archive.infolist():
            if member.is_dir() or member.filename.rsplit("/", 1)[-1].startswith("."):
                continue
            if not member.filename.startswith(f"{FSDD_DIR}/") or member.filename.count("/") != 1:
                raise InputError(f"{location}: entry {member.filename!r} is not {FSDD_DIR}/<name>.wav")
            try:
                blobs.append((member.filename, archive.read(member)))
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as exc:
                raise InputError(f"{location}: entry {member.filename!r} is corrupt or truncated ({exc})") from exc
    return sorted(blobs)


def resolve_fsdd(path: Path) -> Source:
    """``recordings.zip``, a folder holding it or ``recordings/``, or the recordings folder itself."""
    if path.is_file():
        location = path
    elif (path / FSDD_ZIP).is_file():
        location = path / FSDD_ZIP
    elif (path / FSDD_DIR).is_dir():
        location = path / FSDD_DIR
    elif path.is_dir() and any(path.glob("*.wav")):
        location = path
    else:
        raise InputError(f"{path}: no FSDD recordings; expected {FSDD_ZIP} or a {FSDD_DIR}/ folder of .wav files")
    if location.is_dir():
        hashed = [
            (f"{FSDD_DIR}/{p.name}", p)
            for p in sorted(location.iterdir())
            if p.is_file() and not p.name.startswith(".")
        ]
    else:
        hashed = [(FSDD_ZIP, location)]

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        blobs = _read_recordings(location)
        if not blobs:
            raise InputError(f"{location}: holds no recordings")
        parsed = [_parse_name(name, str(location)) for name, _ in blobs]
        labels = np.array([digit for digit, _ in parsed], dtype=np.int64)
        is_test = np.array([test for _, test in parsed], dtype=bool)
        features = _features(blobs, str(location), progress)
        train_x = features[~is_test]
        info = DatasetInfo(
            name="fsdd",
            modality="sequence",
            input_shape=(LOG_MEL.n_mels, LOG_MEL.n_frames),
            num_classes=10,
            class_names=tuple(str(d) for d in range(10)),
            mean=tuple(float(v) for v in train_x.mean(axis=(0, 2), dtype=np.float64)),
            std=tuple(float(v) for v in train_x.std(axis=(0, 2), dtype=np.float64)),
            source=str(location),
            source_sha256=sha256,
            test_split=f"FSDD convention: recordings with index 0-{FSDD_TEST_MAX_INDEX} of each speaker and digit",
        )
        return Dataset(info, train_x, labels[~is_test], features[is_test], labels[is_test])

    return Source("fsdd", str(location), hashed, decode, {"log_mel": asdict(LOG_MEL)})
