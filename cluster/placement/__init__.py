"""Where a job could go right now: the placement generators (``generators``: first fit, best
fit, same leaf, SJF-BCO's least busy, fragment first fit and bounded placement) and where
Slurm's select/cons_tres puts a request (``slurm_select``: fixed shapes and flexible
``--gpus=N`` requests; ``flexible_tree``: the nodes ``topology/tree`` picks for a flexible
one)."""
