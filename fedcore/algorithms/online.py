"""The online-learning comparison algorithms of the OPS and DOG papers: DOG and DOL.

The two papers compare their methods against a small family of baselines. fedcore
registers each under one name:

======================  ==============  =====================================================
paper name              registry name   update
======================  ==============  =====================================================
DOG (Zhao et al.)       ``"dog"``       combine-then-adapt on doubly stochastic ``W``
                                        (:class:`DOG`, the same update as ``"dpsgd"``)
DOL-asymm (He et al.)   ``"dol"``       adapt-then-combine push-sum mixing without
                                        de-biasing (:class:`DOL`)
OPS (He et al.)         ``"ops"``       adapt-then-combine push-sum with de-biasing
COL / COG               ``"central"``   exact average of all post-step models each round
LOCAL                   ``"local"``     no communication
======================  ==============  =====================================================

The papers' "DOL-symm" baseline is :class:`DOL` on a graph whose push-sum weights are also
doubly stochastic (a regular graph such as a ring or torus, where uniform push-sum weights
are doubly stochastic, or Metropolis–Hastings weights supplied with the graph). There
:class:`DOL` equals plain ``"ops"`` step for step, as the push-sum weight stays 1.

The difference between :class:`DOG` and :class:`DOL` on a doubly stochastic ``W`` is only
the order of the two halves of a round (combine-then-adapt against adapt-then-combine):
DOG combines, then adapts with the gradient taken at the node's own *pre-mix* model; DOL
adapts, then combines the post-step models. Their means move identically (by ``-lr``
times the mean gradient); their iterates do not.

With a node optimizer (``[optimizer]``), its direction ``u_i``, from the gradient at the
point the node predicts with, replaces ``lr * g`` in both (for DOL on the numerator, as in
OPS); the means then move by the mean of the ``u_i``.
"""

from __future__ import annotations

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.algorithms.reference import ModelOnly, ModelState
from fedcore.algorithms.rule import Rows, Rule, Send, Slot
from fedcore.messages import MessageSchema, ScalarSpec

__all__ = ["DOG", "DOL", "DOGRule", "DOLRule"]

_SHARE = ScalarSpec(0.0, 1.0, "a push-sum share of a sender whose weight is 1")


class DOGRule(DPSGDRule):
    """DOG: Decentralized Online Gradient, combine-then-adapt.

    Zhao, Yu, Zhao, Tang, Qiu, Liu, "Decentralized Online Learning: Take Benefits from
    Others' Data without Sharing Your Own to Track Global Trend" (arXiv 1901.10593).
    Per round, node ``i`` predicts with and suffers its loss at its own model ``x_i``, then::

        g   = grad f_{i,t}(x_i)                  # at the node's own PRE-mix model
        x_i = sum_j W_ji x_j - lr * g            # W symmetric, doubly stochastic

    This is exactly D-PSGD (Lian et al. 2017) run on an online loss stream, so ``DOG``
    *is* :class:`~fedcore.algorithms.dpsgd.DPSGD` under another name: the two give the
    same iterates step for step, bit for bit. Everything about ``"dpsgd"`` holds here:
    it needs a symmetric trust graph with doubly stochastic weights
    (Metropolis–Hastings by default); the mean moves exactly by ``-lr`` times the mean
    gradient (I-DOG-1); and a missing neighbour (deadline mode) is replaced by the node's
    own value, its weight going to the self weight.

    FedML's "DOL" baseline (``ClientDSGD``) is *not* this algorithm: it is
    adapt-then-combine (step first, then mix the post-step models), which is
    :class:`DOL` in fedcore.
    """

    name = "dog"


DOG = DOGRule


class DOLRule(ModelOnly, Rule):
    """DOL: decentralized online learning on a one-way trust graph, no de-biasing.

    The "DOL-asymm" baseline of He, Tan, Tang, Qiu, Liu, "Central Server Free Federated
    Learning over Single-sided Trust Social Networks" (arXiv 1910.04956), as in FedML's
    ``ClientDSGD``: Online Push-Sum (``"ops"``) without the push-sum weight ``omega``. With
    ``W_ij`` the share node ``i`` pushes to out-neighbour ``j`` (``sum_j W_ij = 1``, self
    included; mixing family ``"push-sum"``), per round, adapt-then-combine::

        g        = grad f_i(x_i)                 # the model is x itself
        x_half_i = x_i - lr * g
        send W_ij * x_half_i to every out-neighbour j
        x_i      = W_ii * x_half_i + sum_k (received shares W_ki * x_half_k)

    What holds and what does not (rows are nodes, ``x_{t+1} = W^T x_{t+1/2}``):

    * Every sender splits all of its model, so with every message delivered
      ``sum_i x_i`` moves exactly by ``-lr * sum_i g_i``: the *uniform average of the
      models* follows the centralized step ``mean x <- mean x - lr * mean g``, on any
      push-sum weights.
    * The *models themselves* do not reach consensus unless ``W`` is also doubly
      stochastic. With ``lr = 0`` on a strongly connected digraph, ``x_i`` tends to
      ``n * pi_i * mean(x_0)``, where ``pi`` is the Perron vector of ``W``
      (``pi^T W = pi^T``, ``sum pi = 1``) and ``n * pi_i`` is the limit of OPS's weight
      ``omega_i``. Each node's model is thus scaled by its Perron weight; OPS's division
      by ``omega`` is exactly what removes that bias (I-OPS-3). With gradients the nodes
      take their steps at these scaled points. With ``lr = 0``, DOL's ``x`` is OPS's
      numerator ``x`` bit for bit.
    * On doubly stochastic weights (``pi`` uniform) DOL is adapt-then-combine
      decentralized online gradient and equals ``"ops"`` step for step; on ``W = I`` it is
      ``"local"``; on ``W = 11^T / n`` it is ``"central"`` (COL).

    A missing message (dropped, late or crashed sender) is simply absent, as in plain
    push-sum: the share the sender pushed is lost, so the receiver's model shrinks
    towards 0 by that share, and ``sum_i x_i`` drops by it. Nothing re-weights the rest:
    that is the "no de-biasing" of the baseline (unlike DOG, which gives a missing
    neighbour's weight to the node itself).

    Messages have push-sum's format (tensor ``"x"`` plus scalar ``"omega"``), sent as
    weighted shares like OPS's. The sender's weight is fixed at 1, so the scalar is just
    the share ``W_ij``; the receiver ignores it, but refuses one outside ``(0, 1]``.
    """

    name = "dol"
    mixing = "push-sum"
    pattern = "neighbours"

    def step(self, state: ModelState, grad: torch.Tensor, rows: Rows) -> tuple[ModelState, Send]:
        """Gradient step on ``x``, then push each out-neighbour its share of the result."""
        x_half = state.x - rows.lr * grad
        ones = torch.ones(x_half.shape[0], dtype=torch.float64, device=x_half.device)
        return ModelState(x_half), Send({"x": x_half}, {"omega": ones}, weighted=True)

    def schema(self, phase: int) -> MessageSchema:
        """The share ``"x"`` and the scalar ``"omega"`` (the share's weight, in ``(0, 1]``)."""
        return model_schema("x", omega=_SHARE)

    def mix(
        self, state: ModelState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[ModelState, None]:
        """Keep the own share and add the shares that arrived (a missing one is lost)."""
        dtype = state.x.dtype
        x = state.x * rows.self_weight.to(dtype).unsqueeze(1)
        for slot in inbox:
            x.addcmul_(slot.tensors["x"], slot.arrived.to(dtype).unsqueeze(1))
        return ModelState(x), None


DOL = DOLRule
