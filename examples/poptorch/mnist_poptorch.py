"""MNIST in PopTorch, in the shape of Graphcore's "Intro to PopTorch" program, on the simulated IPU.

The PopTorch calls are the ones an IPU program makes, in the same places: `poptorch.Options()
.deviceIterations`, `poptorch.DataLoader(opts, ...)`, `poptorch.trainingModel(..., optimizer=...)`,
`poptorch.inferenceModel`, `detachFromDevice`. Nothing is downloaded: by default the images are
generated (MNIST-shaped, 1 x 28 x 28, ten classes, each a noisy stroke pattern); `--mnist-dir` reads
the real MNIST files (`train-images-idx3-ubyte[.gz]` and friends) from a folder you provide.

    python examples/poptorch/mnist_poptorch.py --epochs 2
"""

from __future__ import annotations

import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn

import poptorch


class Block(nn.Module):
    """Convolution, max-pool, ReLU."""

    def __init__(self, in_channels, num_filters, kernel_size, pool_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_filters, kernel_size=kernel_size)
        self.pool = nn.MaxPool2d(kernel_size=pool_size)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    """Two convolution blocks and two fully connected layers: 28 x 28 images -> 10 class scores.

    The sizes are the tutorial's (32 and 64 filters, 128 hidden units); `filters` and `hidden` make a
    smaller or larger variant of the same program.
    """

    def __init__(self, filters: tuple[int, int] = (32, 64), hidden: int = 128):
        super().__init__()
        self.features = filters[1] * 5 * 5  # 28 -> 26 -> 13 -> 11 -> 5
        self.layer1 = Block(1, filters[0], 3, 2)
        self.layer2 = Block(filters[0], filters[1], 3, 2)
        self.layer3 = nn.Linear(self.features, hidden)
        self.layer3_act = nn.ReLU()
        self.layer3_dropout = nn.Dropout(0.5)
        self.layer4 = nn.Linear(hidden, 10)
        self.softmax = nn.LogSoftmax(1)

    def forward(self, x):
        x = self.layer2(self.layer1(x))
        x = x.view(-1, self.features)
        x = self.layer3_dropout(self.layer3_act(self.layer3(x)))
        return self.softmax(self.layer4(x))


class TrainingModelWithLoss(nn.Module):
    """The network with its loss, as PopTorch trains it: forward returns (output, loss)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = nn.NLLLoss()

    def forward(self, args, loss_inputs=None):
        output = self.model(args)
        if loss_inputs is None:
            return output
        return output, self.loss(output, loss_inputs)


def accuracy(predictions, labels):
    _, ind = torch.max(predictions, 1)
    # With the training model's default output mode (Final) only the last micro-batch's predictions
    # come back: compare them with the last labels.
    labels = labels[-predictions.size()[0] :]
    return torch.sum(torch.eq(ind, labels)).item() / labels.size()[0] * 100.0


def synthetic_mnist(samples: int, seed: int) -> torch.utils.data.TensorDataset:
    """MNIST-shaped data: each class is a fixed random stroke pattern, shifted by a pixel and noised."""
    patterns = torch.Generator().manual_seed(1234)
    templates = (torch.rand(10, 1, 28, 28, generator=patterns) > 0.8).float()
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = templates[labels]
    shifts = torch.randint(-1, 2, (samples, 2), generator=g)
    images = torch.stack([img.roll(tuple(s.tolist()), dims=(1, 2)) for img, s in zip(images, shifts)])
    images = images + 0.5 * torch.randn(images.shape, generator=g)
    return torch.utils.data.TensorDataset((images - 0.1307) / 0.3081, labels)


def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist_from_files(folder: str, train: bool) -> torch.utils.data.TensorDataset:
    """The MNIST idx files in `folder` (gzipped or not), normalised as the tutorial does."""
    prefix = "train" if train else "t10k"

    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
        raise FileNotFoundError(
            f"{stem}[.gz] not found in {folder}: download MNIST there, or leave out --mnist-dir."
        )

    images = torch.tensor(_read_idx(find(f"{prefix}-images-idx3-ubyte")), dtype=torch.float32) / 255.0
    labels = torch.tensor(_read_idx(find(f"{prefix}-labels-idx1-ubyte")), dtype=torch.long)
    return torch.utils.data.TensorDataset(((images - 0.1307) / 0.3081).unsqueeze(1), labels)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description="MNIST training in PopTorch")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size for training (default: 8)")
    parser.add_argument(
        "--test-batch-size", type=int, default=80, help="batch size for testing (default: 80)"
    )
    parser.add_argument("--epochs", type=int, default=2, help="number of epochs to train (default: 2)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default: 0.05)")
    parser.add_argument("--device-iterations", type=int, default=50, help="device iterations (default: 50)")
    parser.add_argument("--train-samples", type=int, default=8000, help="synthetic training samples")
    parser.add_argument("--test-samples", type=int, default=800, help="synthetic test samples")
    parser.add_argument(
        "--mnist-dir", default=None, help="a folder with the MNIST idx files (default: synthetic)"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    if args.mnist_dir:
        train_set, test_set = mnist_from_files(args.mnist_dir, True), mnist_from_files(args.mnist_dir, False)
    else:
        train_set, test_set = synthetic_mnist(args.train_samples, 1), synthetic_mnist(args.test_samples, 2)

    opts = poptorch.Options().deviceIterations(args.device_iterations)
    training_data = poptorch.DataLoader(
        opts, train_set, batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    test_data = torch.utils.data.DataLoader(
        test_set, batch_size=args.test_batch_size, shuffle=True, drop_last=True
    )

    model = Network()
    training_model = TrainingModelWithLoss(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    training_model = poptorch.trainingModel(training_model, opts, optimizer=optimizer)
    inference_model = poptorch.inferenceModel(model)

    # Run training
    for epoch in range(args.epochs):
        for data, labels in training_data:
            preds, losses = training_model(data, labels)
        print(
            f"epoch {epoch + 1}: loss {float(losses):.4f}, accuracy of the last micro-batch {accuracy(preds, labels):.1f}%"
        )

    # Detach the training model so that the same IPU could be used for validation
    training_model.detachFromDevice()

    # Run validation
    sum_acc = 0.0
    with torch.no_grad():
        for data, labels in test_data:
            output = inference_model(data)
            sum_acc += accuracy(output, labels)
    test_accuracy = sum_acc / len(test_data)
    print(f"Accuracy on test set: {test_accuracy:0.2f}%")
    return test_accuracy


if __name__ == "__main__":
    main()
