"""A Flax NNX model trained with FedAvg on LEAF Synthetic(0.5, 0.5)."""

from flax import nnx

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(60, 32, rngs=rngs)
        self.out = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


data = leaf_synthetic(num_clients=20, alpha=0.5, beta=0.5)
history = fedjax_het.run(
    data,
    fedjax_het.Training(
        models.from_nnx(Net),  # Net(rngs) built from the run's seed
        fedavg(),
        uniform(num_clients=20, cohort_size=5),
        rounds=10,
        work=fedjax_het.LocalWork(batch_size=10),
        hyper={"client_lr": 0.1},
        eval_every=10,
    ),
    output=fedjax_het.Output(progress=False),
)
for m in history.metrics:
    print(f"round {m['round']}: test accuracy {m['test_accuracy']:.4f}")
