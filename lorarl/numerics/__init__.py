"""Numerical pieces the trainer, the pack, the memory planner and the report share, below all of them:

* :mod:`.precision`: a cell's ``train.precision`` resolved (load dtype, trainable-tensor casts);
* :mod:`.kl`: the KL estimators and whether a cell needs a reference model;
* :mod:`.divergence`: a non-finite loss or gradient, the ``diverged`` state of a cell's summary.
"""
