"""minidet's errors: one base, :class:`MinidetError`, whose message is one line naming the file, key or option, and
its kinds; each program catches the base (and ``OSError``), not a list of its own. They need no torch (the
``minidet`` command's help, ``configs`` and ``weights list`` import none).

- :class:`ConfigError`: a config file, key, value or command-line option;
- :class:`CheckpointError`: a checkpoint missing, unreadable, or that does not fit the model;
- :class:`InputError`: an input the run cannot use: an image, a video, a dataset, the output folder's state;
- :class:`RuntimeFailure`: what runs the model: an exported graph's runtime, another process of the run;
- :class:`Interrupted`: a run stopped by a signal (SIGTERM; Ctrl-C is Python's KeyboardInterrupt), its finished
  work kept. Like KeyboardInterrupt it is no ``Exception`` (a ``SystemExit`` with the exit status 128 + signal):
  the loops that report an image's failure and go on (``except Exception``) let it through.
"""

from __future__ import annotations


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters: a value as a one-line message shows it."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MinidetError(Exception):
    """An error minidet reports as one line (``str(err)``) naming the file, key or option; the programs catch it."""


class ConfigError(MinidetError, ValueError):
    """A config file or override is invalid; the message names the key or file."""


class CheckpointError(MinidetError, RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model (one-line message). ``refused``: the
    global (``module.name``) a refused pickle asked for, else None; ``content``: a reader parsed the file and
    what it holds is wrong."""

    def __init__(self, message: str, refused: str | None = None, content: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.content = content


class InputError(MinidetError):
    """An input the run cannot use (an image, a video, a dataset, the output folder and its chunks)."""


class RuntimeFailure(MinidetError, RuntimeError):
    """What runs the model failed: an exported graph's runtime, another process of the run, the cluster."""


class Interrupted(SystemExit):
    """A run stopped by the signal ``signum`` (raised by its handler, unwinding like Ctrl-C); its exit status is
    128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum
