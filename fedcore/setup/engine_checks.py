"""What ``simulate``'s engine can run, as far as the config tells: the cheap engine checks of
the run plan (:func:`check_engine`, :func:`vectorized_refusal`), each reading only the
engine's part of the config (:class:`EngineInputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.algorithms import Algorithm
from fedcore.algorithms.asynchronous import is_asynchronous
from fedcore.algorithms.rule import is_rule
from fedcore.compression import CodecOptions, codec_seed
from fedcore.compression.batched import make_row_codec
from fedcore.config import CompressionConfig, Config, SimulateConfig, TransportConfig
from fedcore.errors import ConfigError

__all__ = ["EngineInputs", "check_engine", "engine_error", "vectorized_refusal"]


@dataclass(frozen=True, slots=True)
class EngineInputs:
    """What the engine checks (:func:`check_engine`, :func:`vectorized_refusal`) read of a
    config (:meth:`of`).

    Attributes:
        simulate: ``[simulate]``: the engine and device asked for.
        transport: ``[transport]`` (its mode).
        compression: ``[compression]``: the codec every message is sent in.
        seed: ``run.seed``, which seeds a node's codec.
    """

    simulate: SimulateConfig
    transport: TransportConfig
    compression: CompressionConfig
    seed: int

    @classmethod
    def of(cls, config: Config) -> EngineInputs:
        """The engine checks' part of ``config``."""
        return cls(config.simulate, config.transport, config.compression, config.run.seed)


def vectorized_refusal(inputs: EngineInputs, algorithm: Algorithm) -> str | None:
    """Why ``simulate``'s vectorized engine cannot run ``algorithm`` under the config of
    ``inputs``, as far as the config tells (one short clause), or None.

    Only the set-up tells the rest (the engine's memory need, with the model's size:
    :func:`fedcore.engines.vectorized.unsupported` calls this, then checks the rest).
    Deadline mode and silent losses are no reason here: ``simulate`` runs them in virtual
    time."""
    if not is_rule(algorithm):
        return (
            f"algorithm {algorithm.name!r} has no batched form: it follows the per-message "
            "protocol; write it as an update rule (fedcore.algorithms.rule.Rule) to run it on "
            "every peer at once"
        )
    if inputs.transport.mode == "deadline" and algorithm.holds_in_deadline_mode:
        return (
            f"{algorithm.name} holds a silent peer's pushes in deadline mode, which only "
            "the message engine models"
        )
    c = inputs.compression
    codec = make_row_codec(c.codec, CodecOptions.of(c), seeds=(codec_seed(inputs.seed, 0),))
    if getattr(algorithm, "widths", None) is not None and not codec.deterministic:
        return (
            f"{algorithm.name} with the stochastic codec {codec.name!r} draws for messages of "
            "several lengths in an order only the message engine models"
        )
    return None


def engine_error(simulate: SimulateConfig, reason: str) -> ConfigError:
    """The refusal of a ``simulate.engine`` (``vectorized``), or a ``simulate.device``
    other than the CPU, that the vectorized engine cannot run, for ``reason``."""
    if simulate.engine == "vectorized":
        return ConfigError(
            f"simulate.engine = 'vectorized' cannot run this config: {reason}. Use "
            "simulate.engine = 'messages' (or 'auto')."
        )
    return ConfigError(
        f"simulate.device = {simulate.device!r} needs the vectorized engine, which "
        f"cannot run this config: {reason}. Use simulate.device = 'cpu'."
    )


def check_engine(inputs: EngineInputs, algorithm: Algorithm) -> None:
    """Refuse, with the cheap checks, a ``simulate.engine`` (or ``simulate.device``) that
    cannot run ``algorithm``: an asynchronous algorithm on any engine but ``auto`` (the
    event engine runs it), or the vectorized engine asked for (by name, or by a device
    other than the CPU) where :func:`vectorized_refusal` gives a reason.

    Raises:
        ConfigError: such an engine or device.
    """
    engine = inputs.simulate.engine
    if is_asynchronous(algorithm):
        if engine != "auto":
            raise ConfigError(
                f"simulate.engine = {engine!r} cannot run the asynchronous algorithm "
                f"{algorithm.name!r}, which runs on the event engine; set "
                "simulate.engine = 'auto'."
            )
        return
    if engine == "messages" or (engine == "auto" and inputs.simulate.device == "cpu"):
        return
    reason = vectorized_refusal(inputs, algorithm)
    if reason is not None:
        raise engine_error(inputs.simulate, reason)
