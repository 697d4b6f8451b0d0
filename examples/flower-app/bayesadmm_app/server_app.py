"""The ServerApp: the run config's method as the strategy, started as Flower's FedAvg is."""

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from bayesadmm.flower import strategy_from_config
from bayesadmm_app.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    model = Net()
    strategy = strategy_from_config(context.run_config, model=model)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(context.run_config["num-server-rounds"]),
    )
    torch.save(result.arrays.to_torch_state_dict(), strategy.run_dir / "final_model.pt")  # the posterior's mean
    print(f"posterior: {strategy.run_dir / 'posterior.safetensors'}")  # the whole posterior (bayesadmm.load)
