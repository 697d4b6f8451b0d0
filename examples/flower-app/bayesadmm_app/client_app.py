"""The ClientApp: each node answers the strategy with its own model and data (bayesadmm.flower.client)."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from bayesadmm.flower import client
from bayesadmm_app.task import Net, load_data

app = ClientApp()


def _data(context: Context, split: int):
    partition, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    return load_data(partition, partitions)[split]


@app.query()
def query(msg: Message, context: Context) -> Message:
    return client.query(msg, context, Net(), _data(context, 0))


@app.train()
def train(msg: Message, context: Context) -> Message:
    return client.train(msg, context, Net(), _data(context, 0))


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return client.evaluate(msg, context, Net(), _data(context, 1))
