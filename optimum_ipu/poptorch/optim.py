"""`poptorch.optim`: PopTorch's optimizers (SGD, Adam, AdamW, LAMB, RMSprop) with its extra arguments.

Filled in with the step that adds the fp16 paths; until then torch's optimizers are used as they are.
"""

from torch.optim import SGD, Adam, AdamW, RMSprop

__all__ = ["SGD", "Adam", "AdamW", "RMSprop"]
