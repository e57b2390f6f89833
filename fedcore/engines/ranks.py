"""The process group a sharded run's ranks share (torch.distributed, gloo on CPUs), and the
few collectives the sharded engine (:mod:`fedcore.engines.sharded`) makes.

A rank learns who it is from the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``; :func:`from_environment`), the same
environment ``fedcore simulate --ranks R`` gives the R local processes it starts
(:mod:`fedcore.simulation.ranks`). Every collective waits at most the group's timeout
(:func:`join`'s ``timeout_s``), so a rank that died or hangs stops the others within a
bounded time; a collective that fails raises
:class:`~fedcore.errors.PeerUnavailableError`, one line that says so.

Which peers a rank holds is a sorted list of global rows per rank
(:mod:`fedcore.engines.partition`): contiguous :func:`blocks` of graph order, the first
``n % R`` one peer larger, or a partition of the graph of the same sizes; the gathers here
read only those lists.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from fedcore.errors import ConfigError, PeerUnavailableError

__all__ = [
    "ENVIRONMENT",
    "MEET_S",
    "Ranks",
    "add_everywhere",
    "blocks",
    "exchange",
    "exchange_start",
    "from_environment",
    "gather_rows",
    "join",
    "largest_everywhere",
    "leave",
    "lost",
    "reduce_to_first",
]

logger = logging.getLogger(__name__)

ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and ``fedcore simulate --ranks``) sets for every rank; ``LOCAL_RANK``
too, which only picks a GPU (not used on the CPU)."""


@dataclass(frozen=True)
class Ranks:
    """Who this process is among the run's ranks.

    Attributes:
        rank: This process's rank, ``0 .. world - 1``; rank 0 writes the results.
        world: Number of ranks.
        local_rank: The rank on its own machine (``LOCAL_RANK``; GPUs only).
        local_world: The ranks on this machine (``LOCAL_WORLD_SIZE``, else ``world``): they
            share its cores.
        address, port: The rendezvous (rank 0's ``MASTER_ADDR`` and ``MASTER_PORT``).
        environment: Read from the environment (:func:`from_environment`): the group is
            joined through it (``env://``), so that torchrun's own store serves it where
            torchrun says so (``TORCHELASTIC_USE_AGENT_STORE``).
    """

    rank: int
    world: int
    local_rank: int = 0
    address: str = "127.0.0.1"
    port: int = 0
    environment: bool = False
    local_world: int = 0

    @property
    def on_this_machine(self) -> int:
        """The ranks that share this machine's cores."""
        return self.local_world or self.world

    @property
    def label(self) -> str:
        """``"rank 1 of 2"``: how an error line names this rank."""
        return f"rank {self.rank} of {self.world}"


def from_environment(environ: Mapping[str, str] | None = None) -> Ranks | None:
    """The :class:`Ranks` torchrun's environment describes, or ``None`` where none of its
    variables is set (a plain one-process run).

    Raises:
        ConfigError: some of the variables are set but not all, or one is not a number.
    """
    env = os.environ if environ is None else environ
    present = [name for name in ENVIRONMENT if env.get(name)]
    if not present:
        return None
    missing = [name for name in ENVIRONMENT if name not in present]
    if missing:
        raise ConfigError(
            f"the environment sets {', '.join(present)} but not {', '.join(missing)}: a "
            "sharded run needs all four (as torchrun sets them); unset them for a "
            "one-process run."
        )
    numbers = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        text = env.get(name) or ""
        if name.startswith("LOCAL") and not text:
            numbers[name] = 0
            continue
        if not text.strip().isdigit() or len(text.strip()) > 9:
            raise ConfigError(
                f"{name} = {text[:40]!r} is not a whole number (0 or more) as torchrun sets it."
            )
        numbers[name] = int(text)
    rank, world = numbers["RANK"], numbers["WORLD_SIZE"]
    if world < 1 or not rank < world:
        raise ConfigError(f"RANK = {rank} is not a rank of WORLD_SIZE = {world}.")
    port = numbers["MASTER_PORT"]
    if not 1 <= port <= 65535:
        raise ConfigError(f"MASTER_PORT = {port} is not a TCP port (1 to 65535).")
    local, local_world = numbers["LOCAL_RANK"], numbers["LOCAL_WORLD_SIZE"]
    if local_world > world or (local_world and local >= local_world):
        raise ConfigError(
            f"LOCAL_RANK = {local} and LOCAL_WORLD_SIZE = {local_world} do not fit "
            f"WORLD_SIZE = {world}."
        )
    address = env["MASTER_ADDR"].strip()
    if not address or any(c.isspace() for c in address) or len(address) > 253:
        raise ConfigError(f"MASTER_ADDR = {env['MASTER_ADDR'][:40]!r} is not a host name.")
    return Ranks(
        rank, world, local, address, port, environment=environ is None, local_world=local_world
    )


def blocks(n: int, world: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each rank's peers: contiguous blocks of graph order, as equal as can
    be (the first ``n % world`` one larger)."""
    size, extra = divmod(n, world)
    out = []
    lo = 0
    for r in range(world):
        hi = lo + size + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


MEET_S = 60.0
"""Seconds at least that ranks wait for each other to meet (their set-ups may take longer
than a collective's timeout; a launcher bounds a start that never comes)."""


def join(ranks: Ranks, timeout_s: float) -> None:
    """Join the process group of ``ranks`` (gloo), every collective bounded by
    ``timeout_s``; the meeting itself waits up to ``max(timeout_s, MEET_S)``. The rendezvous
    is a TCP store at rank 0's address, or torchrun's own store where torchrun says so
    (``TORCHELASTIC_USE_AGENT_STORE``; the meeting then has ``timeout_s``).

    Raises:
        PeerUnavailableError: the ranks did not meet in time.
    """
    if dist.is_initialized():
        return
    meet = max(timeout_s, MEET_S)
    collective = datetime.timedelta(seconds=timeout_s)
    try:
        socket.getaddrinfo(ranks.address, ranks.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(
            f"MASTER_ADDR = {ranks.address!r} does not resolve to an address: {_first(exc)}."
        ) from None

    def meet_them() -> None:
        form_group()
        # Every rank's connections made before any goes on: a rank that returned while
        # another still connected, and then died, would fail that one's meeting instead
        # of its first collective (one process group, one way to lose a rank).
        dist.barrier()

    def form_group() -> None:
        if ranks.environment and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            dist.init_process_group(
                "gloo",
                init_method="env://",
                rank=ranks.rank,
                world_size=ranks.world,
                timeout=collective,
            )
            return
        # Rank 0's store waits until every rank has reached it: the group forms at once.
        store = dist.TCPStore(  # type: ignore[attr-defined]  # re-exported from torch._C
            ranks.address,
            ranks.port,
            ranks.world,
            is_master=ranks.rank == 0,
            timeout=datetime.timedelta(seconds=meet),
        )
        dist.init_process_group(
            "gloo", store=store, rank=ranks.rank, world_size=ranks.world, timeout=collective
        )

    try:
        _interruptible(meet_them)
    except (RuntimeError, ValueError, TypeError, OSError) as exc:
        raise PeerUnavailableError(
            f"could not meet the other ranks at {ranks.address}:{ranks.port} within "
            f"{meet:g} s: {_first(exc)}"
        ) from exc


def _interruptible(wait: Callable[[], None]) -> None:
    """Run ``wait`` (a call into torch that blocks in C++ and would hold off Ctrl-C and
    SIGTERM until it returns) in a thread, so that this one stays free to take them."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            wait()
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="fedcore-meet", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failure:
        raise failure[0]


def leave() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def lost(ranks: Ranks, what: str, exc: BaseException) -> PeerUnavailableError:
    """The one-line error of a collective ``what`` that failed with ``exc``."""
    return PeerUnavailableError(
        f"lost contact with the other ranks during {what} (another rank failed or "
        f"stopped answering): {_first(exc)}"
    )


def exchange(
    ranks: Ranks, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
) -> torch.Tensor:
    """One ``all_to_all_single``: ``send``'s rows in blocks of ``send_counts`` (one per
    destination rank, in rank order) go out; the rows every rank sends here come back in
    blocks of ``recv_counts``, in rank order.

    Raises:
        PeerUnavailableError: the exchange failed.
    """
    return exchange_start(ranks, send, send_counts, recv_counts)()


def exchange_start(
    ranks: Ranks, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int]
) -> Callable[[], torch.Tensor]:
    """:func:`exchange` started and not waited for: the rows travel (gloo's own thread)
    while the caller works; the returned function waits for them and returns them.

    Raises:
        PeerUnavailableError: the exchange failed (raised by either call).
    """
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    if ranks.world == 1:
        out.copy_(send)
        return lambda: out
    payload = send.contiguous()
    try:
        work = dist.all_to_all_single(
            out,
            payload,
            output_split_sizes=list(recv_counts),
            input_split_sizes=list(send_counts),
            async_op=True,
        )
    except (RuntimeError, ValueError) as exc:
        raise lost(ranks, "the halo exchange", exc) from exc
    return _Pending(ranks, work, out, payload)


@dataclass(eq=False)
class _Pending:
    """An exchange on its way (:func:`exchange_start`): calling it waits for the rows."""

    ranks: Ranks
    work: Any
    out: torch.Tensor
    payload: torch.Tensor | None
    """What goes out, held until the exchange is done."""

    def __call__(self) -> torch.Tensor:
        try:
            self.work.wait()
        except (RuntimeError, ValueError) as exc:
            raise lost(self.ranks, "the halo exchange", exc) from exc
        self.payload = None
        return self.out


def reduce_to_first(ranks: Ranks, value: torch.Tensor, what: str) -> bool:
    """Sum ``value`` over the ranks into rank 0's ``value`` (in place); return whether this
    is rank 0 (the only one whose ``value`` then holds the sum).

    Raises:
        PeerUnavailableError: the reduce failed.
    """
    if ranks.world > 1:
        try:
            dist.reduce(value, dst=0, op=dist.ReduceOp.SUM)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, what, exc) from exc
    return ranks.rank == 0


def add_everywhere(ranks: Ranks, value: torch.Tensor, what: str) -> None:
    """Sum ``value`` over the ranks into every rank's ``value`` (in place; an integer
    tensor's sum is the same whatever order the ranks' parts are added in).

    Raises:
        PeerUnavailableError: the all-reduce failed.
    """
    _all_reduce(ranks, value, what, dist.ReduceOp.SUM)


def largest_everywhere(ranks: Ranks, value: torch.Tensor, what: str) -> None:
    """The element-wise maximum of ``value`` over the ranks into every rank's ``value``
    (in place).

    Raises:
        PeerUnavailableError: the all-reduce failed.
    """
    _all_reduce(ranks, value, what, dist.ReduceOp.MAX)


def _all_reduce(ranks: Ranks, value: torch.Tensor, what: str, op: dist.ReduceOp.RedOpType) -> None:
    if ranks.world > 1:
        try:
            dist.all_reduce(value, op=op)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, what, exc) from exc


def gather_rows(
    ranks: Ranks, local: torch.Tensor, shards: Sequence[npt.NDArray[np.int64]]
) -> torch.Tensor | None:
    """Every rank's rows ``local`` (rank ``r``'s are the global rows ``shards[r]``, in that
    order) put together on rank 0 in global order (``None`` on the others), padded to the
    largest share for gloo's ``gather``.

    Raises:
        PeerUnavailableError: the gather failed.
    """
    if ranks.world == 1:
        return local
    widest = max(int(rows.size) for rows in shards)
    padded = local.new_zeros((widest, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in shards] if ranks.rank == 0 else None
    try:
        dist.gather(padded, parts, dst=0)
    except (RuntimeError, ValueError) as exc:
        raise lost(ranks, "a gather to rank 0", exc) from exc
    if parts is None:
        return None
    n = sum(int(rows.size) for rows in shards)
    out = local.new_empty((n, *local.shape[1:]))
    for part, rows in zip(parts, shards, strict=True):
        out[torch.from_numpy(rows)] = part[: rows.size]
    return out
