"""``minidet export`` (``program``: the export, ``--check``) and its parity gate (``gate``): the program around the
engine's ``minidet.export`` (the graph, its file and its runtimes)."""
