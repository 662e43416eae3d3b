"""Where Optimum Graphcore 0.7 put a Stable Diffusion pipeline's models on IPUs, and with which IPU configs.

The original ran each model of the pipeline (text encoder, UNet, VAE decoder, safety checker) as its own
PopTorch inference model with its own IPU config. With 4 IPUs (or fewer) only the UNet went to the IPUs
(4 of them) and the rest ran on the host in float32; with more than 4, the text encoder took 1 IPU, the
VAE decoder 2 and the safety checker 1. Every model ran one image per call, `num_prompts x
num_images_per_prompt` device iterations per host call (the text encoder `num_prompts`: it encodes each
prompt once). The configs below are the original's published values, picked by the UNet's
`cross_attention_dim` and `sample_size` (768 / 64: SD 1.x; 1024 / 64: SD 2 at 512 px; 1024 / 96: SD 2 at
768 px, whose VAE decoder stayed on the host).

`CUT_POINTS` are the modules at which the original started each IPU's block. A model built with fewer
blocks than Stable Diffusion (a small test model) or a config with another IPU count has the model's
blocks spread over the IPUs by weight instead (said once).
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from optimum_ipu._once import warn_once

__all__ = [
    "CUT_POINTS",
    "INFERENCE_ENGINES_TO_MODEL_NAMES",
    "MODEL_IPU_CONFIGS",
    "get_default_ipu_configs",
    "place_blocks",
]

logger = logging.getLogger(__name__)

# Names of Graphcore's own inference engines for the Hub models they served (kept for scripts that read it).
INFERENCE_ENGINES_TO_MODEL_NAMES = {
    "stable-diffusion-v1": "CompVis/stable-diffusion-v1-4",
    "stable-diffusion-v1-5": "runwayml/stable-diffusion-v1-5",
    "stable-diffusion-512-v2-0": "stabilityai/stable-diffusion-2-base",
    "stable-diffusion-768-v2-0": "stabilityai/stable-diffusion-2",
    "stable-diffusion-512-v2-1": "stabilityai/stable-diffusion-2-1-base",
    "stable-diffusion-768-v2-1": "stabilityai/stable-diffusion-2-1",
    "stable-inpainting-v1-0": "runwayml/stable-diffusion-inpainting",
    "stable-inpainting-512-v2-0": "stabilityai/stable-diffusion-2-inpainting",
}

_TEXT_ENCODER = {"ipus_per_replica": 1, "matmul_proportion": 0.6}
_SAFETY_CHECKER = {"ipus_per_replica": 1, "matmul_proportion": 0.6}
_VAE_512 = {"ipus_per_replica": 2, "matmul_proportion": 0.3}
_UNET_512 = {
    "ipus_per_replica": 4,
    "matmul_proportion": [0.6, 0.6, 0.1, 0.3],
    "attn_matrix_target_mem_mb": 100,
}

# (cross_attention_dim, sample_size) -> the IPU config of each model of the pipeline (None: on the host).
MODEL_IPU_CONFIGS: dict[tuple[int, int], dict[str, dict[str, Any] | None]] = {
    (768, 64): {
        "text_encoder": _TEXT_ENCODER,
        "unet": _UNET_512,
        "vae": _VAE_512,
        "safety_checker": _SAFETY_CHECKER,
    },
    (1024, 64): {
        "text_encoder": _TEXT_ENCODER,
        "unet": _UNET_512,
        "vae": _VAE_512,
        "safety_checker": _SAFETY_CHECKER,
    },
    (1024, 96): {
        "text_encoder": _TEXT_ENCODER,
        "unet": {
            "ipus_per_replica": 4,
            "matmul_proportion": [0.06, 0.1, 0.1, 0.1],
            "attn_matrix_target_mem_mb": 45,
        },
        "vae": None,  # the original had no layout of the 768 px decoder
        "safety_checker": _SAFETY_CHECKER,
    },
}
_SD1 = (768, 64)

# The module starting each IPU's block, as the original placed them (dotted paths, list indices as numbers).
CUT_POINTS: dict[str, list[tuple[str, int]]] = {
    "unet": [
        ("conv_in", 0),
        ("down_blocks.2.downsamplers.0", 1),
        ("up_blocks.0.resnets.2", 2),
        ("up_blocks.1.attentions.2", 3),
    ],
    "vae": [("post_quant_conv", 0), ("decoder.conv_in", 0), ("decoder.up_blocks.2.resnets.2", 1)],
}

ALLOWED_N_IPU = tuple(2**i for i in range(7))  # the pod sizes the original accepted: 1 to 64


def get_default_ipu_configs(
    unet_config: Any,
    n_ipu: int = 4,
    num_prompts: int = 1,
    num_images_per_prompt: int = 1,
    **common_kwargs: Any,
) -> tuple[dict | None, dict | None, dict | None, dict | None]:
    """The IPU config dicts of the UNet, text encoder, VAE decoder and safety checker, as the original chose them.

    Args:
        unet_config: the UNet's config (`pipe.unet.config`); its `cross_attention_dim` and `sample_size`
            pick the Stable Diffusion version's layout (SD 1.x's, said in a warning, for any other pair).
        n_ipu: IPUs the pipeline may use (a power of two, 1 to 64); the text encoder, VAE decoder and
            safety checker go to IPUs only with more than 4 (None: they run on the host in float32).
        num_prompts, num_images_per_prompt: the images of one call; each model runs one per device
            iteration (the text encoder one prompt).
        common_kwargs: IPU config settings given to every model (`executable_cache_dir`, ...).

    Returns:
        (unet, text_encoder, vae, safety_checker) IPU config dicts, None for a model left on the host.
    """
    if isinstance(n_ipu, bool) or n_ipu not in ALLOWED_N_IPU:
        raise ValueError(
            f"n_ipu={n_ipu!r} is not the IPU count of a pod; give one of {', '.join(map(str, ALLOWED_N_IPU))}."
        )
    key = (_config_value(unet_config, "cross_attention_dim"), _config_value(unet_config, "sample_size"))
    if key not in MODEL_IPU_CONFIGS:
        logger.warning(
            "The UNet's cross_attention_dim=%s and sample_size=%s are none of Stable Diffusion's (SD 1.x: 768, 64; "
            "SD 2 at 512 px: 1024, 64; SD 2 at 768 px: 1024, 96): using SD 1.x's IPU configs.",
            *key,
        )
    configs = MODEL_IPU_CONFIGS.get(key, MODEL_IPU_CONFIGS[_SD1])
    common = {**common_kwargs, "inference_device_iterations": num_prompts * num_images_per_prompt}

    def with_common(name: str, **extra: Any) -> dict | None:
        if name != "unet" and n_ipu <= 4:
            return None
        config = configs[name]
        return None if config is None else {**config, **common, **extra}

    return (
        with_common("unet"),
        with_common("text_encoder", inference_device_iterations=num_prompts),  # one encoding per prompt
        with_common("vae"),
        with_common("safety_checker"),
    )


def _config_value(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def place_blocks(model: nn.Module, component: str, ipus: int, begin_block) -> list[tuple[str, int]]:
    """Start a block (`begin_block(module, name, ipu_id)`, PopTorch's `BeginBlock`) at each cut of `component`.

    The original's cut points when the model has them all and the config gives their IPU count; otherwise
    the model's blocks in execution order (`_blocks_in_order`), cut into `ipus` runs of about equal
    weight. Returns the (module path, IPU) cuts made.
    """
    cuts = CUT_POINTS.get(component, [])
    if not cuts and ipus <= 1:
        return []  # one IPU: the whole model is its block
    names = {name for name, _ in model.named_modules()}
    if not (cuts and all(path in names for path, _ in cuts) and max(ipu for _, ipu in cuts) + 1 == ipus):
        if ipus > 1:
            warn_once(
                logger,
                "The %s has not the blocks at which Optimum Graphcore cut it, or its IPU config asks for another "
                "IPU count (%d): its blocks are spread over the %d IPUs by weight.",
                component,
                ipus,
                ipus,
                key=("spread", component),
            )
        cuts = _spread(_blocks_in_order(model, component), ipus)
    for path, ipu in cuts:
        model.set_submodule(path, begin_block(model.get_submodule(path), path, ipu_id=ipu))
    return cuts


def _blocks_in_order(model: nn.Module, component: str) -> list[tuple[str, nn.Module]]:
    """The top-level blocks of a UNet or VAE decoder in the order its forward runs them."""
    prefix, model = ("decoder.", model.decoder) if component == "vae" else ("", model)
    down = getattr(model, "down_blocks", [])
    blocks = [("conv_in", model.conv_in), *((f"down_blocks.{i}", block) for i, block in enumerate(down))]
    if getattr(model, "mid_block", None) is not None:
        blocks.append(("mid_block", model.mid_block))
    blocks += [(f"up_blocks.{i}", block) for i, block in enumerate(model.up_blocks)]
    return [(prefix + path, block) for path, block in blocks]


def _spread(blocks: list[tuple[str, nn.Module]], ipus: int) -> list[tuple[str, int]]:
    """Cut `blocks` into `ipus` consecutive runs of about equal weight: the (first block, IPU) of each run."""
    weights = [sum(p.numel() for p in block.parameters()) or 1 for _, block in blocks]
    total, seen, cuts = sum(weights), 0, [(blocks[0][0], 0)]
    for (path, _), weight in zip(blocks, weights):
        ipu = min(ipus - 1, int(ipus * seen / total))
        if ipu > cuts[-1][1] and len(cuts) < ipus:
            cuts.append((path, cuts[-1][1] + 1))
        seen += weight
    return cuts
