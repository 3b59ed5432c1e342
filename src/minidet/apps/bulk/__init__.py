"""Bulk runs: many inputs through the model, resumable, in one process, under torchrun or on a Ray cluster.

- ``job``: the set-up ``infer`` and ``eval`` share (``BulkJob``), the rule for which images run together
  (``forwards``, ``shard``), the batches (``run_batches``), the driver that stops a run cleanly (``drive``).
- ``chunks``: the durable chunk store (a run's identity, its finished inputs).
- ``infer_job``: ``minidet infer``'s job (its loop, writer threads, videos, results file).
- ``raydata``: ``--engine ray`` (``Detect``, the actors' callable class, and the driver's job).
- ``dist``: torchrun's set-up; ``loader``: images read in DataLoader workers; ``inputs``: input listing.
"""
