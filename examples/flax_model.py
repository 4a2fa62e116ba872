"""A Flax Linen model trained with FedAvg on the four clients of your_data.py."""

import flax.linen as nn

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.sampling import uniform

from your_data import four_clients  # examples/your_data.py, beside this file


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.relu(nn.Dense(16)(x)))


mine = four_clients()
history = fedjax_het.run(
    mine,
    *fedjax_het.run_options(  # run's four option groups from flat keywords
        model=models.from_linen(MLP(), mine.example_shape),
        algorithm=fedavg(),
        sampler=uniform(num_clients=4, cohort_size=2),
        rounds=20,
        work=fedjax_het.LocalWork(batch_size=10),
        hyper={"client_lr": 0.3},
        eval_every=10,
        progress=False,
    ),
)
print(f"test accuracy {history.metrics[-1]['test_accuracy']:.4f}")
