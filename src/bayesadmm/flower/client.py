"""What your own ClientApp calls to take part in a run of a bayesadmm strategy (`bayesadmm.flower.strategy`), with
your model and the node's own data:

    app = ClientApp()

    @app.query()        # the strategy asks each node once which client it is and how many examples it holds
    def query(msg, context):
        return bayesadmm.flower.client.query(msg, context, Net(), load_data(context, "train"))

    @app.train()        # one round of the method's client update; the client's state stays in context.state
    def train(msg, context):
        return bayesadmm.flower.client.train(msg, context, Net(), load_data(context, "train"))

    @app.evaluate()     # the global (and, where the method has one, the personal) posterior on the node's data
    def evaluate(msg, context):
        return bayesadmm.flower.client.evaluate(msg, context, Net(), load_data(context, "test"))

`data` is the node's examples: an (X, y) pair of tensors or arrays, a torch Dataset of (x, y) pairs, or a
DataLoader over one (its dataset is used: the method batches it itself). They are checked against the model and the
likelihood as `bayesadmm.run` checks a client's, and cast to the run's precision. The node's client id is its node
config's ``partition-id`` (Flower's simulation sets it, with ``num-partitions``; a deployed SuperNode gets it from
``--node-config``). The method, its hyperparameters, the seed and the likelihood come from the strategy with each
message, so the ClientApp holds no configuration of the run; `likelihood=` overrides the one the message names (a
likelihood of your own, which the message cannot carry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message
from torch import nn

from bayesadmm.clients import ClientData, SupervisedData
from bayesadmm.federated import flat_model
from bayesadmm.flower.app_config import likelihood_of
from bayesadmm.flower.client_app import DataOf, _dtype, handle_evaluate, handle_query, handle_train
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.userdata import as_tensors, check_data

__all__ = ["query", "train", "evaluate"]


def query(
    message: Message, context: Context, model: nn.Module | FlatModel, data: Any, *, likelihood: Likelihood | None = None
) -> Message:
    """The reply to the strategy's query: this node's client id and number of examples."""
    return handle_query(message, context, _own(model, data, likelihood))


def train(
    message: Message, context: Context, model: nn.Module | FlatModel, data: Any, *, likelihood: Likelihood | None = None
) -> Message:
    """One round of the method's client update on `data`: the reply the strategy aggregates."""
    return handle_train(message, context, _own(model, data, likelihood))


def evaluate(
    message: Message, context: Context, model: nn.Module | FlatModel, data: Any, *, likelihood: Likelihood | None = None
) -> Message:
    """The global posterior's metrics on `data` (at the mean and the predictive; ``personal_*`` for the client's own
    posterior where the method has one), with the number of examples as their weight."""
    return handle_evaluate(message, context, _own(model, data, likelihood))


def _own(model: nn.Module | FlatModel, data: Any, likelihood: Likelihood | None) -> DataOf:
    """The node's data as a ClientData, built when the message's setup (precision, device, likelihood) is known."""

    def data_of(text: str, setup: Mapping[str, Any], node_config: Mapping[str, Any], k: int) -> ClientData:
        if isinstance(data, ClientData) and not isinstance(data, (tuple, list)):
            return data
        flat, theta = flat_model(model)  # theta: only its shape and dtype matter to the checks
        theta = theta.to(_dtype(setup))
        chosen = likelihood if likelihood is not None else likelihood_of(setup)
        pair = as_tensors(getattr(data, "dataset", data), f"the data of node {context_note(node_config)}")
        parts, _ = check_data(flat, theta, chosen, {k: pair})
        X, y = parts[k]
        return SupervisedData(flat, X.to(setup["device"]), y.to(setup["device"]), chosen)

    return data_of


def context_note(node_config: Mapping[str, Any]) -> str:
    """How a node is named in an error: its partition id."""
    return f"with partition-id={node_config.get('partition-id', '?')}"
