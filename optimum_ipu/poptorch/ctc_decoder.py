"""`poptorch.ctc_beam_search_decoder`: the most likely label sequences under a CTC model, by prefix beam search.

PopTorch runs PopLibs' CTC beam search (validated against TensorFlow's `ctc_beam_search_decoder`
with `merge_repeated=False`). This is the same search in PyTorch: a beam holds a label prefix with
two log-probabilities, of the alignments that reach it ending in a blank and ending in its last
label; each time step extends every beam by the blank, its last label (the same prefix) or a new
label (a longer prefix; a repeat of the last label only after a blank), merges extensions that make
the same prefix, and keeps the `beam_width` most probable prefixes.
"""

from __future__ import annotations

import torch

from optimum_ipu.poptorch._logging import Error

__all__ = ["ctc_beam_search_decoder"]

_NEG_INF = float("-inf")


def _search(log_probs: torch.Tensor, blank: int, beam_width: int) -> list[tuple[tuple[int, ...], float]]:
    """Prefix beam search over `log_probs` [T, C]: the final (prefix, log-probability) beams, best first."""
    prefixes: list[tuple[int, ...]] = [()]
    p_blank = torch.zeros(1, dtype=log_probs.dtype)  # log P(alignments of the prefix ending in a blank)
    p_label = torch.full((1,), _NEG_INF, dtype=log_probs.dtype)  # ... ending in the prefix's last label
    classes = log_probs.shape[1]
    for step in log_probs:
        total = torch.logaddexp(p_blank, p_label)
        last = torch.tensor([p[-1] if p else blank for p in prefixes])
        has_last = torch.tensor([bool(p) for p in prefixes])
        # The same prefix: a blank after anything, or the last label again.
        stay_blank = total + step[blank]
        stay_label = torch.where(has_last, p_label + step[last], torch.full_like(p_label, _NEG_INF))
        # A longer prefix: a new label after anything; the last label again only after a blank.
        grow = total[:, None] + step[None, :]
        rows = torch.nonzero(has_last).squeeze(1)
        grow[rows, last[rows]] = p_blank[rows] + step[last[rows]]
        grow[:, blank] = _NEG_INF
        # A longer prefix that is already a beam joins it.
        index = {p: j for j, p in enumerate(prefixes)}
        for j, p in enumerate(prefixes):
            parent = index.get(p[:-1]) if p else None
            if parent is not None:
                stay_label[j] = torch.logaddexp(stay_label[j], grow[parent, p[-1]])
                grow[parent, p[-1]] = _NEG_INF
        scores = torch.cat([torch.logaddexp(stay_blank, stay_label), grow.flatten()])
        order = torch.sort(scores, descending=True, stable=True).indices[:beam_width]
        possible = order[torch.isfinite(scores[order])]  # an impossible prefix (-inf) is no beam
        order = possible if len(possible) else order[:1]
        kept, new_blank, new_label = [], [], []
        for i in order.tolist():
            if i < len(prefixes):
                kept.append(prefixes[i])
                new_blank.append(stay_blank[i])
                new_label.append(stay_label[i])
            else:
                w, c = divmod(i - len(prefixes), classes)
                kept.append((*prefixes[w], c))
                new_blank.append(torch.tensor(_NEG_INF, dtype=log_probs.dtype))
                new_label.append(grow[w, c])
        prefixes, p_blank, p_label = kept, torch.stack(new_blank), torch.stack(new_label)
    final = torch.logaddexp(p_blank, p_label)
    order = torch.sort(final, descending=True, stable=True).indices.tolist()
    return [(prefixes[i], float(final[i])) for i in order]


def ctc_beam_search_decoder(
    probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0, beam_width: int = 100, top_paths: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `top_paths` most likely label sequences of each batch entry under CTC, by beam search.

    Args:
        probs: log-probabilities [input_length, batch_size, num_classes].
        lengths: the time steps to decode of each batch entry [batch_size].
        blank: the blank class.
        beam_width: the prefixes kept at each time step.
        top_paths: the sequences returned per batch entry (at most `beam_width`).

    Returns:
        The paths' log-probabilities [batch_size, top_paths], their lengths [batch_size, top_paths]
        and the paths [batch_size, top_paths, input_length] (0 past a path's length), best first, all
        in `probs`' dtype as PopTorch returns them. A batch entry with fewer distinct paths than
        `top_paths` gets log-probability -inf and length 0 for the rest. No gradient flows.
    """
    if not isinstance(probs, torch.Tensor):
        raise Error(
            f"ctc_beam_search_decoder: probs must be a torch.tensor argument. {type(probs)} is not supported."
        )
    if not isinstance(lengths, torch.Tensor):
        raise Error(
            f"ctc_beam_search_decoder: lengths must be a torch.tensor argument. {type(lengths)} is not supported."
        )
    if probs.dim() != 3:
        raise Error("Input probablities tensor must be rank-3 for `ctc_beam_search_decoder`.")
    time, batch, classes = probs.shape
    if lengths.shape != (batch,):
        raise Error(f"ctc_beam_search_decoder: lengths must be shaped [{batch}] (one per batch entry), got "
                    f"{list(lengths.shape)}.")  # fmt: skip
    if not 0 <= blank < classes:
        raise Error(f"ctc_beam_search_decoder: blank {blank} is not one of the {classes} classes.")
    if not 1 <= top_paths <= beam_width:
        raise Error(
            f"ctc_beam_search_decoder: top_paths ({top_paths}) must be at least 1 and at most beam_width "
            f"({beam_width})."
        )
    out_probs = torch.full((batch, top_paths), _NEG_INF, dtype=probs.dtype)
    out_lengths = torch.zeros((batch, top_paths), dtype=probs.dtype)
    out_paths = torch.zeros((batch, top_paths, time), dtype=probs.dtype)
    work = probs.detach().cpu().to(torch.promote_types(probs.dtype, torch.float32))
    for b in range(batch):
        steps = min(max(int(lengths[b]), 0), time)
        for k, (path, log_p) in enumerate(_search(work[:steps, b], blank, beam_width)[:top_paths]):
            out_probs[b, k] = log_p
            out_lengths[b, k] = len(path)
            out_paths[b, k, : len(path)] = torch.tensor(path, dtype=probs.dtype)
    return out_probs.to(probs.device), out_lengths.to(probs.device), out_paths.to(probs.device)
