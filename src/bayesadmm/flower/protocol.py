"""The names in the Messages the ServerApp and the ClientApp exchange (besides Flower's "arrays", "config" and
"metrics" records). A query's config holds SETUP; a train message's config holds SETUP, SIZES, ROUND, VERSION and
NEXT_VERSION, and, when the server sends the client's state, the state records of `records.save_state`."""

SETUP = "setup"  # JSON: what the node builds its model, likelihood and algorithm from (app_config)
SIZES = "client-sizes"  # JSON: {client id: number of examples}, for algorithms that weigh clients by size
ROUND = "server-round"
VERSION = "state-version"  # the version of the client state the server expects the node to train from
NEXT_VERSION = "next-state-version"  # the version of the state this round's update makes

PARTITION_ID, NUM_PARTITIONS, DATA_DIR = "partition-id", "num-partitions", "data-dir"
NUM_EXAMPLES = "num-examples"
BREAKDOWN = "breakdown"  # a numerical breakdown of the client's update (the engine's BREAKDOWNS)
NEED_STATE = "need-state"  # the node holds another state than the one expected and none was sent

OWN_METRICS = (PARTITION_ID, NUM_EXAMPLES, ROUND)  # a reply's metrics that are not the update's info scalars
