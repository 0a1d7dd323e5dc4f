"""Why a `--model` cannot be served, as typed errors whose message is one line for the user.

Resolution raises these and only these for what a user got wrong or the outside world refused
(a missing file, a GGUF this converter cannot read, a hub id not in the cache while offline, a
download that failed or does not match its pin); the command line prints the message alone and
exits with status 2. Each subclasses the builtin it refines, so callers that know only that still
catch it.
"""


class CheckpointError(Exception):
    """A model reference that cannot be turned into a local Hugging Face folder."""


class ModelNotFoundError(CheckpointError, FileNotFoundError):
    """No folder, file or cached hub snapshot goes by the given name."""


class GGUFError(CheckpointError, ValueError):
    """A .gguf file that is malformed, truncated, or asks for something not supported here."""


class DownloadError(CheckpointError, OSError):
    """A pinned download that could not be fetched, or whose bytes are not the pinned ones."""
