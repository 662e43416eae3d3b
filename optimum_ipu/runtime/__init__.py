"""What runs a host call on the simulated IPU: executables, precision and loss scaling, optimizers, checks.

The trainer hands a combined batch to a `TrainingExecutable` (or an evaluation batch to an
`InferenceExecutable`); the executable splits it into micro-batches, replicas and device iterations,
runs forward and backward in the IPU's numerics and leaves reduced, unscaled gradients where the
optimizer expects them. Nothing here imports transformers, the pipelining rules or the cost model:
the compile step (`optimum_ipu.compiling`) sits above both, running this package's checks and asking
the cost model for its memory and speed report.
"""
