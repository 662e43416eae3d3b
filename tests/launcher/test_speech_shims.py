"""The shims the speech examples need: datasets' Audio columns without torchcodec, `config.tokenizer_class`,
and `train(resume_from_checkpoint=MODEL_FOLDER)`; each as transformers 4 / datasets 2 behaved, and gone afterwards."""

import importlib.util

import numpy as np
import pytest
import transformers
from fixtures import tiny_speech_config

from optimum_ipu.launcher import LauncherError, compatibility_shims
from optimum_ipu.launcher.shims.trainer_api import is_model_folder

no_torchcodec = pytest.mark.skipif(
    importlib.util.find_spec("torchcodec") is not None, reason="torchcodec decodes audio itself"
)


def _pcm_file(path, frames: np.ndarray, rate: int = 16000):
    import wave

    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(frames.shape[1])
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(frames.astype("<i2").tobytes())
    return path


@no_torchcodec
def test_wav_files_decode_as_datasets_2_did(tmp_path):
    """float64 samples = int16 / 32768 (soundfile's scale), stereo averaged to mono, the file's rate, the path."""
    import datasets

    mono = np.array([[0], [16384], [-32768], [32767], [-1]])
    stereo = np.array([[1000, 3000], [-32768, 0], [2, 4]])
    (tmp_path / "train" / "a").mkdir(parents=True)
    _pcm_file(tmp_path / "train" / "a" / "mono.wav", mono)
    _pcm_file(tmp_path / "train" / "a" / "stereo.wav", stereo)
    with pytest.raises(Exception) as failure:  # datasets >= 4 without the shim: cannot even store the paths
        datasets.load_dataset(str(tmp_path), split="train", download_mode="force_redownload")
    assert "torchcodec" in str(failure.value) + str(failure.value.__cause__)
    with compatibility_shims():
        split = datasets.load_dataset(str(tmp_path), split="train", download_mode="force_redownload")
        decoded = {example["audio"]["path"].rsplit("/", 1)[1]: example["audio"] for example in split}
        with_rate = split.cast_column("audio", datasets.Audio(sampling_rate=16000))[0]["audio"]
        resampled = split.cast_column("audio", datasets.Audio(sampling_rate=8000))
        with pytest.raises(
            LauncherError, match="sampled at 16000 Hz .* asks for 8000 Hz: resampling needs torchcodec"
        ):
            resampled[0]["audio"]
    assert decoded["mono.wav"]["array"].dtype == np.float64
    np.testing.assert_array_equal(decoded["mono.wav"]["array"], [0.0, 0.5, -1.0, 32767 / 32768, -1 / 32768])
    np.testing.assert_array_equal(decoded["stereo.wav"]["array"], [2000 / 32768, -0.5, 3 / 32768])
    assert decoded["mono.wav"]["sampling_rate"] == with_rate["sampling_rate"] == 16000


@no_torchcodec
def test_arrays_are_stored_as_16_bit_wav_and_read_back():
    import datasets

    samples = np.array([0.0, 0.25, -0.5, 1.0, -1.0])
    with compatibility_shims():
        stored = datasets.Dataset.from_dict(
            {"audio": [{"array": samples, "sampling_rate": 8000}]},
            features=datasets.Features({"audio": datasets.Audio()}),
        )
        audio = stored[0]["audio"]
    np.testing.assert_array_equal(audio["array"], np.round(samples * 32767) / 32768)
    assert audio["sampling_rate"] == 8000


@no_torchcodec
def test_audio_that_is_not_pcm_wav_says_what_to_install(tmp_path):
    from optimum_ipu.launcher.shims.audio_decoding import read_audio

    (tmp_path / "clip.flac").write_bytes(b"fLaC\x00\x00\x00\x22 not a wav")
    if importlib.util.find_spec("soundfile") is None:
        with pytest.raises(LauncherError, match="reads PCM WAV files only .*pip install torchcodec"):
            read_audio(str(tmp_path / "clip.flac"), None)


def test_config_tokenizer_class_reads_as_transformers_4s_none():
    config = tiny_speech_config()
    with pytest.raises(AttributeError):  # transformers v5 without the shim
        _ = config.tokenizer_class
    with compatibility_shims():
        assert config.tokenizer_class is None
        assert "tokenizer_class" not in config.to_dict()  # nothing new is saved
        named = tiny_speech_config(tokenizer_class="Wav2Vec2CTCTokenizer")
        assert named.tokenizer_class == "Wav2Vec2CTCTokenizer"
        config.tokenizer_class = "BertTokenizer"
        assert (
            config.tokenizer_class == "BertTokenizer"
            and config.to_dict()["tokenizer_class"] == "BertTokenizer"
        )
    assert not hasattr(tiny_speech_config(), "tokenizer_class")  # removed again


def test_a_model_folder_is_not_a_checkpoint_but_a_checkpoint_folder_is(tmp_path):
    model = tmp_path / "model"
    transformers.Wav2Vec2Model(tiny_speech_config()).save_pretrained(model)
    assert is_model_folder(model) and is_model_folder(str(model))
    (model / "optimizer.pt").write_bytes(b"")  # an incomplete checkpoint: left to the trainer's own check
    assert not is_model_folder(model)
    assert (
        not is_model_folder(tmp_path / "missing") and not is_model_folder(True) and not is_model_folder(None)
    )


def test_plain_trainer_resumed_from_a_model_folder_trains_from_step_0(tmp_path):
    """transformers 5 alone stops on the missing trainer_state.json; under the shim training starts at step 0."""
    import torch

    model_dir = tmp_path / "model"
    model = transformers.Wav2Vec2ForSequenceClassification(tiny_speech_config(num_labels=2))
    model.save_pretrained(model_dir)
    data = [{"input_values": torch.randn(800), "labels": i % 2} for i in range(4)]
    args = transformers.TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2,
                                          report_to="none", save_strategy="no")  # fmt: skip
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        transformers.Trainer(model=model, args=args, train_dataset=data).train(
            resume_from_checkpoint=str(model_dir)
        )
    with compatibility_shims():
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        trainer.train(resume_from_checkpoint=str(model_dir))
    assert trainer.state.global_step == 2
