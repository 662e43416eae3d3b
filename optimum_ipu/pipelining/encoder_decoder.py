"""`split_encoder_decoder_ipu_config`: an encoder-decoder model's IPU config as two pipelines.

For training, an encoder-decoder model is one pipeline: `layers_per_ipu` counts the encoder's layers,
then the decoder's, over the same IPUs. For generation Optimum Graphcore ran the encoder and the
decoder as two programs, each on its own IPUs: the encoder once per batch, the decoder once per
token. This split gives each its config, as the original did: the encoder takes the IPUs its layers
fill (a power of two of them), the decoder the rest; per-IPU lists (`matmul_proportion`, the
serialization splits) are cut at the same place.
"""

from __future__ import annotations

from optimum_ipu.configuration.schema import IPUConfigError
from optimum_ipu.pipelining.placement import encoder_decoder_cut, layer_counts_per_ipu


def split_encoder_decoder_ipu_config(ipu_config, num_encoder_layers: int, num_decoder_layers: int):
    """Split `ipu_config` (its current mode's values) into the encoder's config and the decoder's.

    Args:
        ipu_config: the `IPUConfig` of the whole model, `ipus_per_replica` >= 2.
        num_encoder_layers: the model's encoder layers.
        num_decoder_layers: the model's decoder layers.

    Returns:
        `(encoder_ipu_config, decoder_ipu_config)`: copies whose `layers_per_ipu`, `ipus_per_replica`,
        and per-IPU lists are the encoder's and the decoder's parts.

    Raises:
        IPUConfigError: fewer than 2 IPUs, no cut between the encoder's and the decoder's IPUs, or a
            serialized embedding reaching into the decoder's IPUs (or a split projection into the
            encoder's).
    """
    name = ipu_config._get_managed_attr_mode_name
    ipus = ipu_config.ipus_per_replica
    if ipus < 2:
        raise IPUConfigError(  # Optimum Graphcore's sentence first, then ours
            f"Need {name('ipus_per_replica')} to be at least 2 to split ipu_config into encoder and decoder configs: "
            f"{name('ipus_per_replica')}={ipus}, and the encoder and the decoder need an IPU each."
        )
    counts = layer_counts_per_ipu(num_encoder_layers + num_decoder_layers, ipu_config.layers_per_ipu, ipus)
    cut = encoder_decoder_cut(counts, num_encoder_layers, name("layers_per_ipu"))

    encoder, decoder = {"layers_per_ipu": counts[:cut]}, {"layers_per_ipu": counts[cut:]}
    encoder["ipus_per_replica"], decoder["ipus_per_replica"] = cut, ipus - cut
    embedding_splits = ipu_config.serialized_embedding_splits_per_ipu
    if embedding_splits is not None:
        if sum(embedding_splits[cut:]):
            raise IPUConfigError(  # Optimum Graphcore's sentence first, then ours
                "The `SerializedEmbedding` must have all splits placed on the encoder: "
                f"{name('serialized_embedding_splits_per_ipu')}={list(embedding_splits)} puts pieces of the "
                f"embedding on the decoder's IPUs ({list(embedding_splits[cut:])}); the embedding belongs to the "
                f"encoder, IPUs 0 to {cut - 1}: give those IPUs all the pieces."
            )
        encoder["serialized_embedding_splits_per_ipu"] = list(embedding_splits[:cut])
        decoder["serialized_embedding_splits_per_ipu"] = None
    projection_splits = ipu_config.serialized_projection_splits_per_ipu
    if projection_splits is not None:
        if sum(projection_splits[:cut]):
            raise IPUConfigError(
                "The `SplitProjection` must have all splits placed on the decoder: "
                f"{name('serialized_projection_splits_per_ipu')}={list(projection_splits)} puts pieces of the "
                f"output projection on the encoder's IPUs ({list(projection_splits[:cut])}); it belongs to the "
                f"decoder, IPUs {cut} to {ipus - 1}: give those IPUs all the pieces."
            )
        encoder["serialized_projection_splits_per_ipu"] = None
        decoder["serialized_projection_splits_per_ipu"] = list(projection_splits[cut:])
    proportion = ipu_config.matmul_proportion
    if isinstance(proportion, list):
        encoder["matmul_proportion"], decoder["matmul_proportion"] = proportion[:cut], proportion[cut:]
    return ipu_config.copy().update(**encoder), ipu_config.copy().update(**decoder)
