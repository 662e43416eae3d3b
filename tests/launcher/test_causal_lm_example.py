"""A run_clm.py-style script through the launcher reports the model's own evaluation loss.

The configuration of the report that found the bug: a 4-layer GPT-2, blocks of 32 tokens, 32 validation
blocks, micro-batch 1, `--dataloader_drop_last`, `Graphcore/gpt2-small-ipu` on one IPU per layer. The
reference is the saved model itself: the mean of its own loss over the same blocks (each block's loss
is its mean over the 31 tokens it predicts). transformers' Trainer divides GPT-2's summed loss by 32 per
block instead (GPT-2's `loss_type` is None, so it counts every label, not the shifted ones), which gave
31/32 of the loss and a perplexity of 807 for 1,002.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from optimum_ipu.launcher import run_script

SCRIPT = Path(__file__).parent / "scripts" / "causal_lm_task.py"
WORDS = "the ipu runs the model in stages while the host feeds it blocks of text".split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clm")
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=[])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=4, n_head=4,
                        bos_token_id=len(vocab) - 1, eos_token_id=len(vocab) - 1)  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    generator = torch.Generator().manual_seed(1)
    for split, lines in (("train", 40), ("validation", 40)):
        text = [
            " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (5,), generator=generator))
            for _ in range(lines)
        ]
        (folder / f"{split}.txt").write_text("\n".join(text) + "\n")
    return folder


def _blocks(folder: Path, block: int = 32) -> torch.Tensor:
    tokenizer = GPT2TokenizerFast.from_pretrained(folder / "model")
    ids = [
        t
        for line in (folder / "validation.txt").read_text().splitlines()
        for t in tokenizer(line)["input_ids"]
    ]
    usable = len(ids) // block * block
    return torch.tensor(ids[:usable]).view(-1, block)


@pytest.mark.parametrize("device_iterations", [1, 5])
def test_eval_loss_is_the_models_own_mean_loss_over_the_blocks(setup, tmp_path, capsys, device_iterations):
    out = tmp_path / "out"
    args = ["--model_name_or_path", str(setup / "model"), "--ipu_config_name", "Graphcore/gpt2-small-ipu",
            "--validation_file", str(setup / "validation.txt"), "--do_eval", "--per_device_eval_batch_size", "1",
            "--dataloader_drop_last", "--block_size", "32", "--fp32", "--output_dir", str(out), "--report_to", "none",
            "--ipu_config_overrides", f"layers_per_ipu=[1 1 1 1],inference_device_iterations={device_iterations}"]  # fmt: skip
    code = run_script(SCRIPT, args)
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())["eval"]
    blocks = _blocks(setup)
    model = GPT2LMHeadModel.from_pretrained(setup / "model").eval()
    with torch.no_grad():
        losses = torch.stack([model(input_ids=b[None], labels=b[None]).loss for b in blocks])
    assert result["eval_blocks"] == len(blocks) >= 5
    # --dataloader_drop_last reaches evaluation too, as in Optimum Graphcore: only whole calls of
    # inference_device_iterations blocks are evaluated.
    kept = losses[: len(blocks) // device_iterations * device_iterations]
    assert result["eval_loss"] == pytest.approx(kept.mean().item(), rel=1e-5)
    assert result["perplexity"] == pytest.approx(kept.mean().exp().item(), rel=1e-5)
