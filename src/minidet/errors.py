"""minidet's error types that need no torch (the ``minidet`` command's help, ``configs`` and ``weights list`` import
no torch)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model (one-line message). ``refused``: the
    global (``module.name``) a refused pickle asked for, else None; ``content``: a reader parsed the file and
    what it holds is wrong."""

    def __init__(self, message: str, refused: str | None = None, content: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.content = content
