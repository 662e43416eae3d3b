"""Stand-in for the audio decoding datasets 4 moved to torchcodec, when torchcodec is not installed.

datasets 2 and 3 decoded an `Audio` column with soundfile into a dict `{"path", "array",
"sampling_rate"}` (float64 samples in [-1, 1], channels averaged to mono), which Optimum Graphcore's
speech examples read as `audio["array"]`. datasets 4 and later decode and even *encode* (write a
file path into the Arrow table) through torchcodec, which needs FFmpeg's shared libraries: without
them an `audiofolder` of WAV files cannot even be loaded.

When torchcodec is missing, the launcher puts in `Audio.encode_example` / `Audio.decode_example`
that do what datasets 2 did for WAV files: paths and bytes are stored as they are, arrays are
written as 16-bit PCM WAV, and decoding returns datasets 2's dict. WAV is read with soundfile when
it is installed (any format soundfile reads), else with Python's `wave` module (PCM WAV). Audio
at another sampling rate than the column asks for stops with one line: resampling needs torchcodec.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import wave

import numpy as np

from optimum_ipu.launcher._report import LauncherError, note_once
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches

__all__ = ["AUDIO_DECODING", "read_audio", "wav_bytes"]

_INSTALL = "pip install torchcodec (it needs FFmpeg's libraries: apt-get install ffmpeg)"


def _read_wave(source) -> tuple[np.ndarray, int]:
    """Samples (frames, channels) as float64 in [-1, 1] and the rate, from a PCM WAV file or file object."""
    with wave.open(source, "rb") as reader:
        width, channels, rate = reader.getsampwidth(), reader.getnchannels(), reader.getframerate()
        raw = reader.readframes(reader.getnframes())
    if width == 1:  # 8-bit WAV is unsigned
        samples = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width == 3:  # 24-bit: widen each little-endian triple to 32 bits
        triples = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        padded = np.zeros((triples.shape[0], 4), np.uint8)
        padded[:, 1:] = triples
        samples = padded.view("<i4").reshape(-1).astype(np.float64) / 2.0**31
    else:
        samples = np.frombuffer(raw, f"<i{width}").astype(np.float64) / 2.0 ** (8 * width - 1)
    return samples.reshape(-1, channels), rate


def read_audio(path: str | None, data: bytes | None) -> tuple[np.ndarray, int]:
    """Mono float64 samples and the sampling rate of an audio file (its bytes, or its local path).

    Channels are averaged, as datasets 2 did (`librosa.to_mono`) and as datasets 4's decoder does.
    """
    source = io.BytesIO(data) if data is not None else path
    if importlib.util.find_spec("soundfile") is not None:
        samples, rate = importlib.import_module("soundfile").read(source, always_2d=True)
    else:
        try:
            samples, rate = _read_wave(source)
        except (wave.Error, EOFError) as error:
            name = path or "audio bytes"
            raise LauncherError(
                f"cannot decode {name!r}: torchcodec is not installed and optimum-ipu's stand-in reads PCM WAV "
                f"files only ({error}); {_INSTALL}, or pip install soundfile for FLAC/OGG."
            ) from None
    return samples.mean(axis=1), int(rate)


def wav_bytes(array, sampling_rate: int) -> bytes:
    """`array` (mono, or frames x channels, floats in [-1, 1]) as a 16-bit PCM WAV file, as datasets 2 stored arrays."""
    samples = np.asarray(array, dtype=np.float64)
    samples = samples.reshape(samples.shape[0], -1)
    pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(samples.shape[1])
        writer.setsampwidth(2)
        writer.setframerate(int(sampling_rate))
        writer.writeframes(pcm.tobytes())
    return buffer.getvalue()


def _on_use() -> None:
    note_once("audio", "torchcodec is not installed: datasets' Audio columns are read and written by optimum-ipu's "
              "stand-in (WAV; decoded as datasets 2 did, to {'path', 'array', 'sampling_rate'}).")  # fmt: skip


def _encode_example(self, value) -> dict:
    _on_use()
    if value is None:
        raise ValueError("value must be provided")
    if isinstance(value, os.PathLike):
        return {"bytes": None, "path": os.path.abspath(os.fspath(value))}
    if isinstance(value, str):
        return {"bytes": None, "path": value}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value), "path": None}
    if value.get("array") is not None:
        return {"bytes": wav_bytes(value["array"], value["sampling_rate"]), "path": None}
    if value.get("bytes") is not None or value.get("path") is not None:
        return {"bytes": value.get("bytes"), "path": value.get("path")}
    raise ValueError(f"An audio sample should have one of 'path' or 'bytes' but both are None in {value}.")


def _decode_example(self, value, token_per_repo_id=None) -> dict:
    _on_use()
    if not self.decode:
        raise RuntimeError("Decoding is disabled for this feature. Please use Audio(decode=True) instead.")
    if not isinstance(value, dict) or "array" in value:
        return value  # already decoded
    path, data = value.get("path"), value.get("bytes")
    if data is None and (path is None or not os.path.isfile(path)):
        raise LauncherError(
            f"cannot decode the audio file {path!r}: torchcodec is not installed and optimum-ipu's stand-in reads "
            f"local files only; {_INSTALL}."
        )
    array, rate = read_audio(path, data)
    if self.sampling_rate is not None and rate != self.sampling_rate:
        raise LauncherError(
            f"{path or 'an audio file'} is sampled at {rate} Hz and the Audio column asks for {self.sampling_rate} "
            f"Hz: resampling needs torchcodec, which is not installed; {_INSTALL}, or resample the files beforehand."
        )
    return {"path": path, "array": array, "sampling_rate": rate}


def _install_audio_decoding(patches: Patches) -> Skip | None:
    datasets = importlib.import_module("datasets")
    if not hasattr(datasets.config, "TORCHCODEC_AVAILABLE"):
        return Skip("this datasets decodes audio with soundfile")
    if importlib.util.find_spec("torchcodec") is not None:
        return Skip("torchcodec is installed")
    patches.set(datasets.Audio, "encode_example", _encode_example)
    patches.set(datasets.Audio, "decode_example", _decode_example)
    return None


AUDIO_DECODING = Shim(
    name="Audio decoding",
    replaces="datasets' `Audio` columns (an `audiofolder`, `cast_column(..., Audio(...))`, `audio['array']`), which "
    "datasets 4 reads and writes with torchcodec, when torchcodec is not installed",
    by="optimum-ipu's stand-in for WAV files: decoded as datasets 2 did, to `{'path', 'array', 'sampling_rate'}` "
    "(float64, channels averaged; soundfile when installed, else Python's `wave`); arrays stored as 16-bit PCM WAV; "
    "a file at another sampling rate than the column's stops with a line saying to install torchcodec",
    install=_install_audio_decoding,
)
