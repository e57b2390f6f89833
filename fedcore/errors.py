"""The one error tree of fedcore.

Every error fedcore raises on purpose is a :class:`FedcoreError`. Each subclass also
inherits the builtin exception it refines, so callers that catch ``ValueError`` or
``ConnectionError`` keep working::

    FedcoreError
    ├── ConfigError(ValueError)           bad configuration file, key or value
    ├── TopologyError(ValueError)         invalid trust graph, weights or graph file
    ├── DataError(ValueError)             dataset, partition or model that cannot be built
    ├── CompressionError(ValueError)      bytes that do not decode under their codec header
    ├── AlgorithmError(RuntimeError)      an algorithm got input it cannot use
    │   └── UserCodeError                 a user's rule raised, or returned what no engine can use
    └── TransportError(RuntimeError)      a message could not be delivered or received
        ├── PeerUnavailableError(ConnectionError)   a peer cannot be reached
        ├── TransportTimeoutError(TimeoutError)     strict-mode wait for in-neighbours ran out
        ├── ProtocolError                            a message broke the wire protocol
        │   ├── UntrustedPeerError                   sender is not a trusted in-neighbour
        │   ├── RunMismatchError                     sender belongs to another run or version
        │   ├── MessageTooLargeError                 message exceeds the receiver's bound
        │   │   └── TooManyStreamsError              a sender holds too many streams open
        │   ├── OutOfWindowError                     a round too far ahead of the receiver's
        │   └── StalledStreamError                   a stream stalled between chunks or overall
        ├── MessageRefusedError                      the receiver refused a message we sent
        └── TransportClosedError                     the transport was used after close()

Messages are full sentences that name the bad value and, where there is one, the fix.
The CLI turns any of these into one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import traceback
from pathlib import Path

__all__ = [
    "AlgorithmError",
    "CompressionError",
    "ConfigError",
    "DataError",
    "FedcoreError",
    "MessageRefusedError",
    "MessageTooLargeError",
    "OutOfWindowError",
    "PeerUnavailableError",
    "ProtocolError",
    "RunMismatchError",
    "StalledStreamError",
    "TooManyStreamsError",
    "TopologyError",
    "TransportClosedError",
    "TransportError",
    "TransportTimeoutError",
    "UntrustedPeerError",
    "UserCodeError",
]


class FedcoreError(Exception):
    """Base class of every error fedcore raises on purpose."""


class ConfigError(FedcoreError, ValueError):
    """A configuration file, key or value is invalid."""


class TopologyError(FedcoreError, ValueError):
    """A trust graph, its mixing weights or a graph file is invalid."""


class DataError(FedcoreError, ValueError):
    """A dataset, partition or model cannot be built as configured."""


class CompressionError(FedcoreError, ValueError):
    """Encoded bytes do not match their codec header."""


class AlgorithmError(FedcoreError, RuntimeError):
    """An algorithm received state or messages it cannot use."""


class UserCodeError(AlgorithmError):
    """A user's rule (``algorithm.name = "pkg.module:factory"``) raised, or returned
    something the engines cannot use: the message names the rule, the method and what was
    expected. Its traceback (the user's frames) is for the rule's author:
    :meth:`keep_traceback` writes it into the run's folder and says where in the message.

    Attributes:
        trace: The traceback of the user's error, as text (kept when pickled).
        log: Where :meth:`keep_traceback` wrote it (``None``: not written).
    """

    LOG = "error.log"
    """The file in a run's (or peer's) folder that holds the traceback."""

    EXIT_STATUS = 3
    """The exit status of a process stopped by one (the CLI's, and a launched peer's: the
    launcher reads it back as this error)."""

    def __init__(self, message: str, trace: str = "") -> None:
        """``message``: one sentence; ``trace``: the user's traceback, if there is one."""
        super().__init__(message)
        self.trace = trace
        self.log: Path | None = None

    def keep_traceback(self, folder: Path) -> Path | None:
        """Append the full traceback to ``folder/error.log`` and end the message with
        where it is; the file's path, or ``None`` if it cannot be written (the message
        is then left as it was). Once only: a second call returns the first file."""
        if self.log is not None:
            return self.log
        text = "".join(traceback.format_exception(self)) if self.__traceback__ else ""
        if self.trace and self.__cause__ is None:  # re-raised "from None" on its way here
            text = f"{self.trace}\nwhich fedcore reported as:\n\n{text}" if text else self.trace
        path = Path(folder) / self.LOG
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text if text.endswith("\n") else text + "\n")
        except OSError:
            return None
        self.log = path
        said = str(self.args[0]).rstrip(".") if self.args else ""
        self.args = (f"{said}; the traceback is in {path}.", *self.args[1:])
        return path


class TransportError(FedcoreError, RuntimeError):
    """A message could not be delivered or received."""


class PeerUnavailableError(TransportError, ConnectionError):
    """A peer cannot be reached."""


class TransportTimeoutError(TransportError, TimeoutError):
    """A strict-mode wait for in-neighbours ran out of time."""


class ProtocolError(TransportError):
    """A message broke the wire protocol (wrong sender, run, shape or dtype)."""


class UntrustedPeerError(ProtocolError):
    """The sender is not a trusted in-neighbour of the receiver."""


class RunMismatchError(ProtocolError):
    """The sender belongs to another run (config or graph) or protocol version."""


class MessageTooLargeError(ProtocolError):
    """A message is larger than the receiver accepts."""


class TooManyStreamsError(MessageTooLargeError):
    """A sender already holds as many concurrent streams open as the receiver allows."""


class OutOfWindowError(ProtocolError):
    """A message is for a round further ahead of the receiver's than any honest peer gets."""


class StalledStreamError(ProtocolError):
    """A message stream stalled: too long between chunks, or too slow overall."""


class MessageRefusedError(TransportError):
    """The receiver refused a message this node sent (it answered with a protocol error)."""


class TransportClosedError(TransportError):
    """The transport was used after it was closed."""
