"""The node: one peer of a run, by job: its round loop (:mod:`~fedcore.node.loop`), message
intake and validation (:mod:`~fedcore.node.intake`), what it makes of each phase's arrivals
in its waiting mode (:mod:`~fedcore.node.arrivals`), its records
(:mod:`~fedcore.node.records`), its step-size schedule (:mod:`~fedcore.node.schedule`) and
an update rule's adapter to one peer (:mod:`~fedcore.node.rule`).

Per round a node evaluates the loss and gradient at its algorithm's model on its next
minibatch, lets the algorithm step, encodes and sends the outgoing payloads, collects
each phase's inbox from the transport, decodes and validates it, and lets the
algorithm mix. It records one :class:`RoundRecord` per round.

Two waiting modes:

* ``strict``: wait for every expected sender; if one is still missing after
  ``strict_timeout_s``, fail with :class:`~fedcore.errors.TransportTimeoutError`
  naming who is missing. A message that arrives but fails validation fails the round
  at once with :class:`~fedcore.errors.ProtocolError` naming the sender and the reason:
  a strict run never proceeds without an in-neighbour.
* ``deadline``: wait at most ``deadline_s`` per phase, then proceed with what arrived;
  the rest count as missing (and, if they come later, as late). A message that fails
  validation (undecodable bytes, wrong shape or dtype, non-finite values, another run)
  is logged, counted as rejected and treated as missing; the node keeps going. So is a
  message this node sent that its receiver refused: it is logged once per receiver and
  recorded with the round's unreachable receivers.

Validation (:meth:`Node.validate`, which the gRPC servicer calls before it answers, and
the node itself at collect time): the message belongs to this run; its phase is one of the
algorithm's and it holds exactly what the algorithm's ``message_schema`` says for that phase
and sender (tensor names, shapes and the model's dtype; scalar names and their allowed
values); its bytes decode under their codec to finite values; the algorithm's ``accept``
finds it possible given the node's state (a running total never goes backwards). And its
round is within the window :meth:`Node.round_window` states: a message for a round further
ahead than any honest sender can be is refused (:class:`~fedcore.errors.OutOfWindowError`)
and changes nothing, so one message cannot make the node skip a sender for the rest of the
run; one for a round already collected is late (counted, dropped).
"""

from __future__ import annotations

from fedcore.node.intake import DecodeCache
from fedcore.node.loop import Node
from fedcore.node.records import RoundRecord
from fedcore.node.rule import NodeRule, per_node
from fedcore.node.schedule import NodeOptions, lr_at

__all__ = ["DecodeCache", "Node", "NodeOptions", "NodeRule", "RoundRecord", "lr_at", "per_node"]
