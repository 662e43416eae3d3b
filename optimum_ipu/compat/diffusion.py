"""Optimum Graphcore's Stable Diffusion pipelines on the simulated IPU (`optimum.graphcore.diffusers`).

`IPUStableDiffusionPipeline`, `IPUStableDiffusionImg2ImgPipeline` and `IPUStableDiffusionInpaintPipeline`
are today's diffusers pipelines whose models run as PopTorch inference models, placed as Optimum Graphcore
0.7 placed them (`diffusion_placement`): the UNet on 4 IPUs, and with more than 4 IPUs the text encoder,
VAE decoder and safety checker too; a model not placed runs on the host in float32. Each placed model is
an fp16 copy of the pipeline's model run through `poptorch.inferenceModel`, fed fp16 inputs and returning
float32, as the original's wrappers did; the pipeline's own models stay float32 on the host (their
configs, dtypes and weights are what diffusers reads and saves), and their `forward` (the VAE's
`decode`) calls the placed copy. The scheduler, guidance and image processing are diffusers' own.

What the original's callers passed that today's diffusers would not read is translated here, once:
`init_image=` (now `image=`), and sizes given as strings (`os.getenv` results).

`pipe.ipu_plan()` is the cost model's compile report of each placed model: whether it fits its IPUs and
how long a real IPU system would take for one image, step by step.
"""

from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

try:
    import diffusers  # noqa: F401
except ImportError as error:  # the core does not need it; these pipelines are diffusers' own
    raise ImportError(
        "optimum.graphcore.diffusers' pipelines are diffusers' Stable Diffusion pipelines: pip install "
        "'optimum-ipu[diffusers]' (or diffusers>=0.42)."
    ) from error
from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline, StableDiffusionPipeline
from diffusers.models.attention_processor import SlicedAttnProcessor
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from optimum_ipu._once import warn_once
from optimum_ipu.compat.diffusion_placement import get_default_ipu_configs, place_blocks

__all__ = [
    "DiffusionPlan",
    "IPUStableDiffusionImg2ImgPipeline",
    "IPUStableDiffusionInpaintPipeline",
    "IPUStableDiffusionPipeline",
    "IPUStableDiffusionPipelineMixin",
]

logger = logging.getLogger(__name__)

# The original's settings every placed model got unless the caller's `common_ipu_config_kwargs` said otherwise.
DEFAULT_COMMON_IPU_CONFIG_KWARGS = {
    "enable_half_partials": True,
    "executable_cache_dir": "./exe_cache",
    "inference_device_iterations": 1,
    "inference_replication_factor": 1,
}
_COMPONENTS = ("text_encoder", "unet", "vae", "safety_checker")  # in the order one image runs them
# ----- what each placed model computes on the IPUs (fp16 in, float32 out, as the original's wrappers) -------


class _TextEncoding(nn.Module):
    def __init__(self, text_encoder: nn.Module):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids):
        out = self.text_encoder(input_ids)
        return out.last_hidden_state.float(), out.pooler_output.float()


class _DenoisingStep(nn.Module):
    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[
            0
        ].float()


class _Decoding(nn.Module):
    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, latents):
        return self.vae.decode(latents, return_dict=False)[0].float()


class _SafetyCheck(nn.Module):
    """diffusers' traceable check (`forward_onnx`: scores as tensors, flagged images blacked out)."""

    def __init__(self, safety_checker: nn.Module):
        super().__init__()
        self.safety_checker = safety_checker

    def forward(self, clip_input, images):
        images, has_nsfw_concepts = self.safety_checker.forward_onnx(clip_input, images.clone())
        return images.float(), has_nsfw_concepts


_ON_IPUS = {
    "text_encoder": _TextEncoding,
    "unet": _DenoisingStep,
    "vae": _Decoding,
    "safety_checker": _SafetyCheck,
}


def _override_eps(module: nn.Module, eps: float = 1e-5) -> None:
    """Normalization epsilons below fp16's reach raised to 1e-5, as the original did for its fp16 models."""
    for child in module.modules():
        if isinstance(getattr(child, "eps", None), float):
            child.eps = eps


class _BoundedAttention(SlicedAttnProcessor):
    """diffusers' sliced attention with slices of at most `target_mb` MiB of attention scores, sized per call.

    The original's `attn_matrix_target_mem_mb`: a 512 px UNet's first attention layers score 4096 x 4096
    tokens per head, 512 MiB for the 16 heads of a guided pair in fp16, more than an IPU holds beside its
    weights; sliced, one slice's scores are live at a time. The arithmetic is unchanged (the original
    sliced over query rows, this over heads: each score row is computed whole either way).
    """

    def __init__(self, target_mb: int):
        if target_mb < 1:
            raise ValueError(f"attn_matrix_target_mem_mb={target_mb} must be a positive number of MiB.")
        super().__init__(slice_size=1)
        self.target_bytes = target_mb * 2**20

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None):
        queries = (
            hidden_states.shape[1]
            if hidden_states.ndim == 3
            else hidden_states.shape[2] * hidden_states.shape[3]
        )
        keys = queries if encoder_hidden_states is None else encoder_hidden_states.shape[1]
        self.slice_size = max(1, self.target_bytes // (queries * keys * hidden_states.element_size()))
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask)


def _placed(name: str, module: nn.Module, settings: dict[str, Any]):
    """An fp16 copy of `module`, cut into blocks as the original cut it, as a `poptorch.inferenceModel`."""
    import poptorch
    from optimum_ipu.configuration import IPUConfig

    settings = dict(settings)
    attention_mb = settings.pop("attn_matrix_target_mem_mb", None)
    config = IPUConfig.from_dict(settings)
    model = copy.deepcopy(module).half().eval()
    _override_eps(model)
    if attention_mb is not None and hasattr(model, "set_attn_processor"):
        model.set_attn_processor(_BoundedAttention(attention_mb))
    place_blocks(model, name, config.inference_ipus_per_replica, poptorch.BeginBlock)
    return poptorch.inferenceModel(_ON_IPUS[name](model), config.to_options(for_inference=True))


# ----- the host models' calls, routed to their placed copies ------------------------------------------------


def _run(executor, *inputs):
    """A placed model's call; one with other shapes than its first (compiled) call fails as PopTorch's, saying why."""
    import poptorch

    try:
        return executor(*inputs)
    except poptorch.Error as error:
        if not str(error).startswith("Shape mismatch"):
            raise
        raise poptorch.Error(
            f"{error}\nThe pipeline's models on IPUs are compiled for the shapes of its first call, as on IPUs: "
            "each call must have `num_prompts` prompts (given to from_pretrained), `num_images_per_prompt` images "
            "each and the first call's height and width. For other numbers or sizes, load the pipeline again "
            "with them."
        ) from None


def _on_host(name: str, what: str) -> None:
    warn_once(logger, "The %s runs on the host for calls with %s (the IPU copy was compiled "
              "without them), as float32.", name, what)  # fmt: skip


def _text_encoder_forward(executor, host, input_ids=None, attention_mask=None, *args, **kwargs):
    extra = [k for k, v in kwargs.items() if v is not None and k != "return_dict"]
    if args or attention_mask is not None or extra:
        _on_host("text encoder", ", ".join(extra) or "an attention mask")
        return type(host).forward(host, input_ids, attention_mask, *args, **kwargs)
    last_hidden_state, pooled = _run(executor, input_ids)
    return BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=pooled)


def _unet_forward(executor, host, sample, timestep, encoder_hidden_states, *args, return_dict=True, **kwargs):
    extra = [k for k, v in kwargs.items() if v is not None]
    if args or extra:
        _on_host("UNet", ", ".join(extra) or "more arguments")
        return type(host).forward(host, sample, timestep, encoder_hidden_states, *args, return_dict=return_dict,
                                  **kwargs)  # fmt: skip
    # One timestep per image, so that each device iteration gets its own (the original repeated it).
    timestep = torch.as_tensor(timestep, dtype=torch.float32).reshape(-1).expand(sample.shape[0])
    out = _run(executor, sample.half(), timestep.contiguous(), encoder_hidden_states.half()).to(sample.dtype)
    return UNet2DConditionOutput(sample=out) if return_dict else (out,)


def _vae_decode(executor, z, return_dict=True, generator=None):
    image = _run(executor, z.half()).to(z.dtype)
    return DecoderOutput(sample=image) if return_dict else (image,)


def _safety_checker_forward(executor, clip_input, images):
    as_numpy = isinstance(images, np.ndarray)
    tensor = torch.from_numpy(images) if as_numpy else images
    checked, has_nsfw = _run(executor, clip_input.half(), tensor)
    if has_nsfw.any():
        logger.warning("Potential NSFW content was detected in one or more images. A black image will be returned "
                       "instead. Try again with a different prompt and/or seed.")  # fmt: skip
    checked = checked.to(tensor.dtype)
    return (checked.numpy() if as_numpy else checked), [bool(x) for x in has_nsfw]


def _route(name: str, host: nn.Module, executor) -> None:
    if name == "vae":  # diffusers calls `vae.decode`; the encoder (img2img, inpainting) stays on the host
        host.decode = functools.partial(_vae_decode, executor)
        return
    call = {"text_encoder": _text_encoder_forward, "unet": _unet_forward}.get(name)
    host.forward = (
        functools.partial(call, executor, host)
        if call
        else functools.partial(_safety_checker_forward, executor)
    )


# ----- input the original's callers passed ------------------------------------------------------------------


def _image_size(name: str, value: Any) -> Any:
    """`height` / `width`: a string of digits (what `os.getenv` returns) read as its number, said once."""
    if not isinstance(value, str):
        return value
    if not value.strip().isdigit():
        raise ValueError(f"{name}={value!r} is not a number of pixels: give an integer, e.g. "
                         f"{name}=int(os.getenv(...)).")  # fmt: skip
    warn_once(logger, "%s=%r is a string (as os.getenv returns): read as %d pixels. Optimum Graphcore "
              "passed it on unread, where diffusers failed on it.", name, value, int(value), key=f"size-{name}")  # fmt: skip
    return int(value)


# ----- the plan ------------------------------------------------------------------------------------------


def _verdict(memory) -> str:
    """The memory model's word for the worst IPU: fits, may not fit (within its error), OUT OF MEMORY."""
    if memory.surely_out_of_memory:
        return "OUT OF MEMORY"
    return "may not fit (within the memory model's error)" if memory.may_not_fit else "fits"


@dataclass
class DiffusionPlan:
    """The compile report of each model of a pipeline and the time one call would take on real IPUs.

    Attributes:
        results: per model ("text_encoder", "unet", "vae", "safety_checker"), the `CompileResult` of its
            placed copy (its `.report` is the cost model's `CompileReport`), or None for a model on the host.
        calls: how many times one pipeline call runs each placed model (the UNet: once per denoising step).
    """

    results: dict[str, Any]
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Every placed model's memory estimate is within its IPUs' memory (`may_not_fit` tells how sure)."""
        return all(r.report.memory.fits for r in self._reports().values())

    @property
    def may_not_fit(self) -> list[str]:
        """Placed models with an IPU whose estimate is within the memory model's error of the limit."""
        return [n for n, r in self._reports().items() if r.report.memory.may_not_fit]

    @property
    def seconds_per_call(self) -> float:
        """The placed models' estimated IPU time of one pipeline call (host-side work not counted)."""
        return sum(r.report.performance.call_time * self.calls.get(n, 1) for n, r in self._reports().items())

    def _reports(self) -> dict[str, Any]:
        return {n: r for n, r in self.results.items() if r is not None and r.report is not None}

    def summary(self) -> str:
        """One line per model (IPUs, peak memory, fits, time per call), the total, then each model's report."""
        lines = ["Stable Diffusion on the simulated IPUs (cost model estimates for a Mk2 IPU system):"]
        for name in _COMPONENTS:
            result = self.results.get(name, "absent")
            if result == "absent":
                continue
            if result is None or result.report is None:
                lines.append(f"  {name:15} on the host (float32): not on IPUs, not estimated")
                continue
            r = result.report
            peak = r.memory.peak
            lines.append(
                f"  {name:15} {r.workload.ipus_per_replica} IPU(s), peak {peak.total / 2**20:.0f} MiB of "
                f"{r.memory.capacity / 2**20:.0f} MiB (IPU {peak.ipu}): {_verdict(r.memory)}; "
                f"{r.performance.call_time * 1e3:.1f} ms per call x {self.calls.get(name, 1)} call(s)"
            )
        verdicts = {_verdict(r.report.memory) for r in self._reports().values()}
        overall = (
            next((v for v in verdicts if v != "fits"), "fits")
            if "OUT OF MEMORY" not in verdicts
            else "OUT OF MEMORY"
        )
        lines.append(f"  one pipeline call: {self.seconds_per_call:.2f} s on IPUs; memory: {overall}")
        for name, result in self._reports().items():
            lines += ["", f"[{name}]", result.report.summary()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ----- the pipelines ---------------------------------------------------------------------------------------


class IPUStableDiffusionPipelineMixin:
    """What the three IPU pipelines add to diffusers' own: placement of their models, the old argument names."""

    def __init__(
        self,
        vae,
        text_encoder,
        tokenizer,
        unet,
        scheduler,
        safety_checker,
        feature_extractor,
        image_encoder=None,
        requires_safety_checker=True,
        n_ipu=4,
        num_prompts=1,
        num_images_per_prompt=1,
        unet_ipu_config=None,
        text_encoder_ipu_config=None,
        vae_ipu_config=None,
        safety_checker_ipu_config=None,
        common_ipu_config_kwargs=None,
    ):
        if common_ipu_config_kwargs is not None and not isinstance(common_ipu_config_kwargs, dict):
            raise TypeError(
                f"`common_ipu_config_kwargs` must be a dict, received {type(common_ipu_config_kwargs)}."
            )
        common = {**DEFAULT_COMMON_IPU_CONFIG_KWARGS, **(common_ipu_config_kwargs or {})}
        defaults = get_default_ipu_configs(unet.config, n_ipu=n_ipu, num_prompts=num_prompts,
                                           num_images_per_prompt=num_images_per_prompt, **common)  # fmt: skip
        given = (unet_ipu_config, text_encoder_ipu_config, vae_ipu_config, safety_checker_ipu_config)
        # As the original: a config given for the text encoder, VAE or safety checker counts only above 4 IPUs.
        settings = {
            name: (mine or default) if name == "unet" or n_ipu > 4 else None
            for name, mine, default in zip(("unet", "text_encoder", "vae", "safety_checker"), given, defaults)
        }
        models = {"vae": vae, "text_encoder": text_encoder, "unet": unet, "safety_checker": safety_checker}
        for model in models.values():
            if isinstance(model, nn.Module):
                model.float()  # the host's share runs in float32 (`torch_dtype=torch.float16` loads fp16)
        super().__init__(
            vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
            safety_checker=safety_checker, feature_extractor=feature_extractor, image_encoder=image_encoder,
            requires_safety_checker=requires_safety_checker,
        )  # fmt: skip
        self._ipu_models: dict[str, Any] = {}
        for name in _COMPONENTS:
            if models[name] is None:
                continue
            if settings[name] is None:
                logger.info("Running %s on the host (float32).", name)
                self._ipu_models[name] = None
                continue
            logger.info("Running %s on IPUs.", name)
            self._ipu_models[name] = _placed(name, models[name], settings[name])
            _route(name, models[name], self._ipu_models[name])

    def __call__(self, *args, **kwargs):
        if "init_image" in kwargs:
            if kwargs.get("image") is not None:
                raise TypeError("Give the starting image once: `image=` (diffusers' name) or `init_image=` "
                                "(the old name), not both.")  # fmt: skip
            warn_once(logger, "init_image= is diffusers' old name of image=: passed as image=.", key="init_image")
            kwargs["image"] = kwargs.pop("init_image")
        for name in ("height", "width"):
            if name in kwargs:
                kwargs[name] = _image_size(name, kwargs[name])
        return super().__call__(*args, **kwargs)

    def set_attention_slice(self, slice_size):
        """As the original: attention slicing is the placement's to choose; a value has no effect (said once)."""
        warn_once(logger, "Attention slicing has no effect on the IPU pipelines (the original chose it from "
                  "attn_matrix_target_mem_mb); slice_size=%r is ignored.", slice_size, key="slice")  # fmt: skip

    def detach_from_device(self) -> None:
        """Release the (simulated) IPUs of every placed model that ran; the next call attaches again."""
        for executor in self._ipu_models.values():
            if executor is not None and executor.isCompiled() and executor.isAttachedToDevice():
                executor.detachFromDevice()

    @property
    def ipu_models(self) -> dict[str, Any]:
        """The `poptorch.PoplarExecutor` of each model placed on IPUs (None: the model runs on the host)."""
        return dict(self._ipu_models)

    def ipu_plan(self, num_inference_steps: int | None = None, guidance_scale: float = 7.5) -> DiffusionPlan:
        """The compile report of each placed model and the IPU time of one call, from the last call's compile.

        Run the pipeline once first (its first call compiles each placed model for the call's image size);
        `num_inference_steps` (default: the scheduler's last count) and `guidance_scale` say how many
        times one call runs the UNet and the text encoder.
        """
        pending = [n for n, e in self._ipu_models.items() if e is not None and not e.isCompiled()]
        if pending:
            raise RuntimeError(
                f"No compile report yet for {', '.join(pending)}: call the pipeline once (the "
                "first call compiles each placed model for its image size), then ask for the plan."
            )
        timesteps = getattr(self.scheduler, "timesteps", None)
        steps = num_inference_steps or (len(timesteps) if timesteps is not None else 0) or 50
        calls = {"text_encoder": 2 if guidance_scale > 1 else 1, "unet": steps}
        results = {n: (e.compile_result if e is not None else None) for n, e in self._ipu_models.items()}
        return DiffusionPlan(results=results, calls=calls)


class IPUStableDiffusionPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionPipeline):
    """diffusers' text-to-image pipeline with its models on (simulated) IPUs, as Optimum Graphcore ran it."""


class IPUStableDiffusionImg2ImgPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionImg2ImgPipeline):
    """diffusers' image-to-image pipeline on (simulated) IPUs; its VAE encoder runs on the host, as the original."""


class IPUStableDiffusionInpaintPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionInpaintPipeline):
    """diffusers' inpainting pipeline on (simulated) IPUs; its VAE encoder runs on the host, as the original."""
