"""Optimum Graphcore's Stable Diffusion pipelines (`optimum.graphcore.diffusers`) against plain diffusers on CPU.

Tiny random pipelines (the UNet and VAE decoder have the blocks at which the original cut them) saved with
`save_pretrained`, loaded by both, run with the same generator: the images agree within fp16 round-off.
"""

import json
import logging

import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKL,
    PNDMScheduler,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
from PIL import Image
from transformers import CLIPConfig, CLIPImageProcessor, CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from optimum.graphcore.diffusers import (
    INFERENCE_ENGINES_TO_MODEL_NAMES,
    IPUStableDiffusionImg2ImgPipeline,
    IPUStableDiffusionInpaintPipeline,
    IPUStableDiffusionPipeline,
    get_default_ipu_configs,
)

FP16 = (
    2.5e-2  # images in [0, 1]: fp16 weights and activations (and norm eps 1e-5) against float32; seen 0.018
)
SIZE = 32


def _unet(in_channels: int) -> UNet2DConditionModel:
    # Stable Diffusion's block layout (its cut points exist), a few channels wide.
    return UNet2DConditionModel(
        sample_size=8, in_channels=in_channels, out_channels=4, layers_per_block=2, block_out_channels=(8, 8, 16, 16),
        norm_num_groups=4, cross_attention_dim=16, attention_head_dim=2,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    )  # fmt: skip


def _tokenizer(folder) -> CLIPTokenizer:
    """A CLIP tokenizer over single letters: enough for lower-case prompts."""
    folder.mkdir()
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in "abcdefghijklmnopqrstuvwxyz":
        vocab[letter] = len(vocab)
        vocab[letter + "</w>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=16)


def _pipeline(tmp, cls, in_channels=4):
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 8, 8), down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, layers_per_block=2, norm_num_groups=4, sample_size=SIZE,
    )  # fmt: skip
    text = CLIPTextModel(CLIPTextConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    ))  # fmt: skip
    checker = StableDiffusionSafetyChecker(CLIPConfig(
        text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": SIZE, "patch_size": 8},
        projection_dim=8,
    ))  # fmt: skip
    features = CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE})
    pipe = cls(
        vae=vae, text_encoder=text, tokenizer=_tokenizer(tmp / "tokenizer-files"), unet=_unet(in_channels),
        scheduler=PNDMScheduler(skip_prk_steps=True, steps_offset=1), safety_checker=checker,
        feature_extractor=features,
    )  # fmt: skip
    pipe.save_pretrained(tmp / "pipeline")
    return str(tmp / "pipeline")


@pytest.fixture(scope="module")
def text_to_image(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("sd"), StableDiffusionPipeline)


@pytest.fixture(scope="module")
def inpainting(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("sd-inpaint"), StableDiffusionInpaintPipeline, in_channels=9)


def _generator():
    return torch.Generator().manual_seed(0)


def _run(pipe, **kwargs):
    return pipe("a cat", num_inference_steps=2, generator=_generator(), output_type="np", **kwargs).images


def _image(seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("n_ipu", [4, 8])
def test_text_to_image_matches_diffusers_with_its_models_placed_as_the_original(text_to_image, n_ipu):
    expected = _run(StableDiffusionPipeline.from_pretrained(text_to_image), height=SIZE, width=SIZE)
    pipe = IPUStableDiffusionPipeline.from_pretrained(
        text_to_image, torch_dtype=torch.float16, n_ipu=n_ipu, num_prompts=1, num_images_per_prompt=1,
        common_ipu_config_kwargs={"executable_cache_dir": "unused"},
    )  # fmt: skip
    images = _run(pipe, height=SIZE, width=SIZE)
    np.testing.assert_allclose(images, expected, atol=FP16)
    assert 0 < np.abs(images - expected).max()  # the placed models did compute in fp16
    placed = {name for name, executor in pipe.ipu_models.items() if executor is not None}
    # 4 IPUs: only the UNet (on all 4); 8: the text encoder (1), VAE decoder (2) and safety checker (1) too.
    assert placed == ({"unet"} if n_ipu == 4 else {"unet", "text_encoder", "vae", "safety_checker"})
    assert pipe.ipu_models["unet"].model.unet.dtype == torch.float16
    assert (
        pipe.unet.dtype == pipe.text_encoder.dtype == torch.float32
    )  # the host's share, and what diffusers reads
    ipus = {name: executor.num_ipus for name, executor in pipe.ipu_models.items() if executor is not None}
    assert ipus == (
        {"unet": 4} if n_ipu == 4 else {"unet": 4, "text_encoder": 1, "vae": 2, "safety_checker": 1}
    )


def test_the_old_init_image_argument_is_image_said_once(text_to_image, caplog):
    start = _image()
    expected = _run(StableDiffusionImg2ImgPipeline.from_pretrained(text_to_image), image=start, strength=0.75)
    pipe = IPUStableDiffusionImg2ImgPipeline.from_pretrained(text_to_image, n_ipu=8)
    with caplog.at_level(logging.WARNING):
        images = _run(pipe, init_image=start, strength=0.75)
        _run(pipe, init_image=start, strength=0.75)
    np.testing.assert_allclose(images, expected, atol=FP16)
    assert sum("init_image= is diffusers' old name of image=" in r.message for r in caplog.records) == 1
    with pytest.raises(TypeError, match="not both"):
        pipe("a cat", image=start, init_image=start)


def test_inpainting_matches_diffusers(inpainting):
    image, mask = _image(1), Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    expected = _run(StableDiffusionInpaintPipeline.from_pretrained(inpainting), image=image, mask_image=mask,
                    height=SIZE, width=SIZE)  # fmt: skip
    pipe = IPUStableDiffusionInpaintPipeline.from_pretrained(inpainting, n_ipu=8)
    images = _run(pipe, image=image, mask_image=mask, height=SIZE, width=SIZE)
    np.testing.assert_allclose(images, expected, atol=FP16)
    assert pipe.ipu_models["unet"].model.unet.config.in_channels == 9


def test_sizes_given_as_strings_are_read_as_numbers_and_bad_ones_fail_clearly(text_to_image, caplog):
    pipe = IPUStableDiffusionPipeline.from_pretrained(text_to_image)
    with caplog.at_level(logging.WARNING):
        from_strings = _run(pipe, height=str(SIZE), width=str(SIZE))
    np.testing.assert_array_equal(from_strings, _run(pipe, height=SIZE, width=SIZE))
    assert any("height='32' is a string" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match=r"width='large' is not a number of pixels: give an integer"):
        pipe("a cat", height=SIZE, width="large")


def test_detach_from_device_releases_every_placed_model_and_a_call_attaches_again(text_to_image):
    pipe = IPUStableDiffusionPipeline.from_pretrained(text_to_image, n_ipu=8)
    pipe.detach_from_device()  # before any call: nothing attached, nothing to do (as the original)
    first = _run(pipe, height=SIZE, width=SIZE)
    placed = [executor for executor in pipe.ipu_models.values() if executor is not None]
    assert all(executor.isAttachedToDevice() for executor in placed)
    pipe.detach_from_device()
    assert not any(executor.isAttachedToDevice() for executor in placed)
    np.testing.assert_array_equal(_run(pipe, height=SIZE, width=SIZE), first)


def test_the_plan_reports_each_placed_model_and_the_time_of_one_call(text_to_image):
    pipe = IPUStableDiffusionPipeline.from_pretrained(text_to_image, n_ipu=8)
    with pytest.raises(RuntimeError, match="call the pipeline once"):
        pipe.ipu_plan()
    _run(pipe, height=SIZE, width=SIZE)
    plan = pipe.ipu_plan()
    assert plan.fits and set(plan.results) == {"text_encoder", "unet", "vae", "safety_checker"}
    unet = plan.results["unet"].report
    assert unet.workload.ipus_per_replica == 4 and unet.workload.samples_per_call == 2  # the guided pair
    assert plan.calls == {
        "text_encoder": 2,
        "unet": len(pipe.scheduler.timesteps),
    }  # PNDM: 3 UNet runs in 2 steps
    by_hand = sum(r.report.performance.call_time * plan.calls.get(n, 1) for n, r in plan.results.items())
    assert plan.seconds_per_call == pytest.approx(by_hand)
    text = plan.summary()
    assert "unet            4 IPU(s)" in text and "memory: fits" in text and "IPU compile report" in text
    assert plan.may_not_fit == []
    host_only = IPUStableDiffusionPipeline.from_pretrained(text_to_image, n_ipu=4)
    _run(host_only, height=SIZE, width=SIZE)
    assert "text_encoder    on the host (float32)" in host_only.ipu_plan().summary()


def test_default_ipu_configs_are_the_originals():
    class UNetConfig:
        cross_attention_dim, sample_size = 768, 64

    unet, text, vae, checker = get_default_ipu_configs(
        UNetConfig(), n_ipu=4, num_prompts=2, num_images_per_prompt=3
    )
    assert (text, vae, checker) == (None, None, None)
    assert unet == {"ipus_per_replica": 4, "matmul_proportion": [0.6, 0.6, 0.1, 0.3], "attn_matrix_target_mem_mb": 100,
                    "inference_device_iterations": 6}  # fmt: skip
    unet, text, vae, checker = get_default_ipu_configs(UNetConfig(), n_ipu=8, num_prompts=2, num_images_per_prompt=3,
                                                       executable_cache_dir="here")  # fmt: skip
    assert text == {"ipus_per_replica": 1, "matmul_proportion": 0.6, "executable_cache_dir": "here",
                    "inference_device_iterations": 2}  # fmt: skip
    assert vae["ipus_per_replica"] == 2 and vae["inference_device_iterations"] == 6
    sd2_768 = {"cross_attention_dim": 1024, "sample_size": 96}
    assert (
        get_default_ipu_configs(sd2_768, n_ipu=16)[2] is None
    )  # the original had no layout for that decoder
    with pytest.raises(ValueError, match=r"n_ipu=3 is not the IPU count of a pod; give one of 1, 2, 4"):
        get_default_ipu_configs(UNetConfig(), n_ipu=3)
    assert INFERENCE_ENGINES_TO_MODEL_NAMES["stable-diffusion-v1-5"] == "runwayml/stable-diffusion-v1-5"


def test_a_call_with_other_shapes_than_the_first_says_what_to_do(text_to_image):
    import poptorch

    pipe = IPUStableDiffusionPipeline.from_pretrained(text_to_image, num_prompts=1)
    _run(pipe, height=SIZE, width=SIZE)
    with pytest.raises(
        poptorch.Error, match=r"(?s)Shape mismatch for sample.*each call must have `num_prompts` prompts"
    ):
        _run(pipe, height=2 * SIZE, width=2 * SIZE)


def test_attention_slicing_has_no_effect_and_says_so_once(text_to_image, caplog):
    pipe = IPUStableDiffusionPipeline.from_pretrained(text_to_image)
    with caplog.at_level(logging.WARNING):
        pipe.enable_attention_slicing()
        pipe.enable_attention_slicing(2)
    assert sum("Attention slicing has no effect" in r.message for r in caplog.records) == 1


def test_the_unets_attention_is_sliced_to_the_originals_memory_target_with_the_same_arithmetic():
    from diffusers.models.attention_processor import Attention, AttnProcessor

    from optimum_ipu.compat.diffusion import _BoundedAttention

    torch.manual_seed(0)
    attention = Attention(query_dim=16, heads=2, dim_head=8)
    tokens = torch.randn(2, 1024, 16)  # scores of one head: 1024 x 1024 x 4 bytes = 4 MiB
    expected = AttnProcessor()(attention, tokens)
    bounded = _BoundedAttention(target_mb=8)
    torch.testing.assert_close(bounded(attention, tokens), expected, atol=1e-5, rtol=1e-5)
    assert bounded.slice_size == 2  # 2 of the 4 (batch x head) score matrices at a time
    with pytest.raises(ValueError, match="attn_matrix_target_mem_mb=0 must be a positive number of MiB"):
        _BoundedAttention(0)


def test_several_prompts_and_images_run_as_device_iterations(text_to_image):
    prompts, each = ["a cat", "a dog"], 2
    kwargs = dict(
        num_images_per_prompt=each, height=SIZE, width=SIZE, num_inference_steps=2, output_type="np"
    )
    expected = StableDiffusionPipeline.from_pretrained(text_to_image)(
        prompts, generator=_generator(), **kwargs
    )
    pipe = IPUStableDiffusionPipeline.from_pretrained(
        text_to_image, n_ipu=8, num_prompts=2, num_images_per_prompt=each
    )
    images = pipe(prompts, generator=_generator(), **kwargs).images
    np.testing.assert_allclose(images, expected.images, atol=FP16)
    options = {name: executor.options for name, executor in pipe.ipu_models.items()}
    assert options["unet"].device_iterations == 4 and options["text_encoder"].device_iterations == 2
    assert (
        pipe.ipu_plan().results["unet"].report.workload.micro_batch_size == 2
    )  # the guided pair of one image
