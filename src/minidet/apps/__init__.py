"""The command-line applications of the ``minidet`` command (``minidet.cli``) and of ``tools/``: ``infer``
(images and videos), ``eval_coco`` (COCO AP and timing), ``benchmark`` (against torchvision), ``weights``
(the registry and cache). Built on the engine; nothing in the engine imports them."""
