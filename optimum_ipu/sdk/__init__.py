"""The Poplar SDK's companions of PopTorch, as optimum-ipu provides them: one room.

`launch`: the launch contract between `poprun` and the instances it launches (the environment
names, and the rule that the instances share the replicas equally).
"""
