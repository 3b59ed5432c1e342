"""``minidet serve``: a model behind HTTP (the ``serve`` extra: Starlette, uvicorn, prometheus-client,
python-multipart). ``program.py`` (the command: config, token, socket, uvicorn), ``app.py`` (the endpoints and every
refusal), ``pool.py`` (worker processes behind one bounded queue; a dead worker replaced), ``protocol.py`` (the
messages of a worker's pipe, named and typed: the request and its answers), ``worker.py`` (one worker: its own
model, one image per forward, the record ``minidet infer`` writes, by the same serializer), ``metrics.py`` (``GET
/metrics``), ``page.html`` (``GET /``: try it in a browser), ``load.py`` (``minidet bench-serve``: the load
benchmark). Nothing in the engine imports this room."""
