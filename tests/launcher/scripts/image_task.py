"""An image-classification script in the style of 0.7's run_image_classification.py, for the launcher's tests.

Uses `load_dataset(..., task="image-classification")`, `AutoFeatureExtractor` for a ViT checkpoint and
`torchvision.transforms`; writes what it got to OUT.json. Usage: image_task.py DATA_DIR MODEL_DIR OUT.json
"""

import json
import sys

import torch
from datasets import load_dataset
from torchvision.transforms import CenterCrop, Compose, Normalize, Resize, ToTensor
from transformers import AutoFeatureExtractor


def main(data_dir, model_dir, out):
    dataset = load_dataset("imagefolder", data_dir=data_dir, task="image-classification")
    extractor = AutoFeatureExtractor.from_pretrained(model_dir)
    size = (extractor.size["height"], extractor.size["width"])
    transform = Compose(
        [Resize(size), CenterCrop(size), ToTensor(), Normalize(extractor.image_mean, extractor.image_std)]
    )
    pixels = transform(dataset["train"][0]["image"].convert("RGB"))
    processed = extractor(dataset["train"][0]["image"].convert("RGB"), return_tensors="pt")["pixel_values"][0]
    with open(out, "w") as file:
        json.dump(
            {
                "columns": dataset["train"].column_names,
                "labels": dataset["train"].features["labels"].names,
                "extractor": type(extractor).__name__,
                "shape": list(pixels.shape),
                "max_difference_to_processor": float((pixels - processed).abs().max()),
                "dtype": str(pixels.dtype),
                "is_tensor": isinstance(pixels, torch.Tensor),
            },
            file,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
