"""Bulk runs: many inputs through the model, resumable, in one process, under torchrun or on a Ray cluster. One loop,
engines that run the images, one ledger of what is finished:

- ``job``: the set-up ``infer`` and ``eval`` share (``BulkJob``) and the driver that stops a run cleanly (``drive``).
- ``ledger``: which images run together (``forwards``, torchrun's ``shard``), this process's share and the run's
  identity (``open_share``, ``begin_run``: what resume checks), the ``Ledger`` of what is finished (chunks of whole
  forwards, saved durably) and the timing records.
- ``engines``: what runs the images: ``LocalEngine`` (this process's model: one process, or each torchrun process
  on its share; ``run_batches``: loader workers, an image the model cannot take skipped) and the ``Forward`` an
  engine hands back; ``raydata``: ``RayEngine`` (``--engine ray``: a pool of ``Detect`` actors).
- ``writer``: the ordered writer (files written by writer threads, inputs handed to the ledger in input order) and
  the input guard (no output replaces an input).
- ``infer_job``: ``minidet infer``'s job (its loop over an engine's forwards, its videos, its results file).
- ``chunks``: the durable chunk store; ``dist``: torchrun's set-up; ``loader``: images read in DataLoader workers;
  ``inputs``: input listing.
"""
